// A small JSON reader/writer (RFC 8259) for safetensors headers, config.json
// and index files: no dependencies, strict parsing, errors name the byte offset.
// Objects keep their keys in file order; duplicate keys are an error.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace arpo {
namespace json {

struct ParseError : std::runtime_error {
  explicit ParseError(const std::string& what) : std::runtime_error(what) {}
};

class Value {
 public:
  enum class Type { Null, Bool, Number, String, Array, Object };
  using Array = std::vector<Value>;
  using Object = std::vector<std::pair<std::string, Value>>;

  Value() = default;
  static Value null() { return Value(); }
  static Value boolean(bool b);
  static Value number(double d);  // never is_integer(): use integer() for exact counts
  static Value integer(int64_t i);
  static Value string(std::string s);
  static Value array(Array a = {});
  static Value object(Object o = {});

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::Null; }
  bool is_bool() const { return type_ == Type::Bool; }
  bool is_number() const { return type_ == Type::Number; }
  bool is_string() const { return type_ == Type::String; }
  bool is_array() const { return type_ == Type::Array; }
  bool is_object() const { return type_ == Type::Object; }
  // True for a number literal written without fraction or exponent that fits
  // int64 exactly (offsets above 2^53 stay exact, unlike a double).
  bool is_integer() const { return type_ == Type::Number && is_integer_; }

  bool as_bool() const;
  double as_double() const;
  int64_t as_int64() const;  // throws unless is_integer()
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;
  Array& mutable_array();
  Object& mutable_object();

  // Object lookup: nullptr when absent (or when this is not an object).
  const Value* find(const std::string& key) const;
  // Appends (object) without a duplicate check; use for building output.
  void set(const std::string& key, Value v);

  static const char* type_name(Type t);

 private:
  Type type_ = Type::Null;
  bool bool_ = false;
  double number_ = 0;
  int64_t integer_ = 0;
  bool is_integer_ = false;
  std::string string_;
  Array array_;
  Object object_;
};

// Parses one JSON value; whitespace may surround it, nothing else may follow.
// Nesting is limited to 256 levels so hostile input cannot exhaust the stack.
Value parse(const char* data, size_t size);
inline Value parse(const std::string& text) { return parse(text.data(), text.size()); }

// Compact serialisation (no spaces), keys in stored order.
std::string dump(const Value& v);
// A JSON string literal for s (quotes and escapes included).
std::string quote(const std::string& s);

}  // namespace json
}  // namespace arpo
