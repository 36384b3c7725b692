// JSON reader/writer for arpo's native layer (see json.h): a recursive-descent
// parser over the RFC 8259 grammar and a compact writer.
#include "format/json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace arpo {
namespace json {

Value Value::boolean(bool b) {
  Value v;
  v.type_ = Type::Bool;
  v.bool_ = b;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.type_ = Type::Number;
  v.number_ = d;  // never an exact integer: use integer() for those
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.type_ = Type::Number;
  v.number_ = static_cast<double>(i);
  v.integer_ = i;
  v.is_integer_ = true;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.type_ = Type::String;
  v.string_ = std::move(s);
  return v;
}
Value Value::array(Array a) {
  Value v;
  v.type_ = Type::Array;
  v.array_ = std::move(a);
  return v;
}
Value Value::object(Object o) {
  Value v;
  v.type_ = Type::Object;
  v.object_ = std::move(o);
  return v;
}

const char* Value::type_name(Type t) {
  switch (t) {
    case Type::Null: return "null";
    case Type::Bool: return "boolean";
    case Type::Number: return "number";
    case Type::String: return "string";
    case Type::Array: return "array";
    case Type::Object: return "object";
  }
  return "?";
}

static std::runtime_error wrong_type(const char* want, Value::Type got) {
  return std::runtime_error(std::string("JSON value is ") + Value::type_name(got) + ", expected " + want);
}

bool Value::as_bool() const {
  if (type_ != Type::Bool) throw wrong_type("boolean", type_);
  return bool_;
}
double Value::as_double() const {
  if (type_ != Type::Number) throw wrong_type("number", type_);
  return number_;
}
int64_t Value::as_int64() const {
  if (!is_integer()) throw wrong_type("integer", type_);
  return integer_;
}
const std::string& Value::as_string() const {
  if (type_ != Type::String) throw wrong_type("string", type_);
  return string_;
}
const Value::Array& Value::as_array() const {
  if (type_ != Type::Array) throw wrong_type("array", type_);
  return array_;
}
const Value::Object& Value::as_object() const {
  if (type_ != Type::Object) throw wrong_type("object", type_);
  return object_;
}
Value::Array& Value::mutable_array() {
  if (type_ != Type::Array) throw wrong_type("array", type_);
  return array_;
}
Value::Object& Value::mutable_object() {
  if (type_ != Type::Object) throw wrong_type("object", type_);
  return object_;
}
const Value* Value::find(const std::string& key) const {
  if (type_ != Type::Object) return nullptr;
  for (const auto& kv : object_)
    if (kv.first == key) return &kv.second;
  return nullptr;
}
void Value::set(const std::string& key, Value v) {
  mutable_object().emplace_back(key, std::move(v));
}

// ------------------------------------------------------------------ parser
namespace {

constexpr int kMaxDepth = 256;

class Parser {
 public:
  Parser(const char* data, size_t size) : p_(data), begin_(data), end_(data + size) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (p_ != end_) fail("unexpected characters after the JSON value");
    return v;
  }

 private:
  const char* p_;
  const char* begin_;
  const char* end_;

  [[noreturn]] void fail(const std::string& what) const {
    throw ParseError("invalid JSON at byte " + std::to_string(p_ - begin_) + ": " + what);
  }

  void skip_ws() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  void expect_literal(const char* lit) {
    for (const char* c = lit; *c; ++c, ++p_)
      if (p_ >= end_ || *p_ != *c) fail(std::string("expected '") + lit + "'");
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than 256 levels");
    if (p_ >= end_) fail("unexpected end of input");
    switch (*p_) {
      case '{': return parse_object(depth);
      case '[': return parse_array(depth);
      case '"': return Value::string(parse_string());
      case 't': expect_literal("true"); return Value::boolean(true);
      case 'f': expect_literal("false"); return Value::boolean(false);
      case 'n': expect_literal("null"); return Value::null();
      default:
        if (*p_ == '-' || (*p_ >= '0' && *p_ <= '9')) return parse_number();
        fail(std::string("unexpected character '") + *p_ + "'");
    }
  }

  Value parse_object(int depth) {
    ++p_;  // '{'
    Value::Object obj;
    skip_ws();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
      return Value::object(std::move(obj));
    }
    for (;;) {
      skip_ws();
      if (p_ >= end_ || *p_ != '"') fail("expected a string key");
      std::string key = parse_string();
      for (const auto& kv : obj)
        if (kv.first == key) fail("duplicate key " + quote(key));
      skip_ws();
      if (p_ >= end_ || *p_ != ':') fail("expected ':' after key " + quote(key));
      ++p_;
      skip_ws();
      obj.emplace_back(std::move(key), parse_value(depth + 1));
      skip_ws();
      if (p_ < end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ < end_ && *p_ == '}') {
        ++p_;
        return Value::object(std::move(obj));
      }
      fail("expected ',' or '}' in object");
    }
  }

  Value parse_array(int depth) {
    ++p_;  // '['
    Value::Array arr;
    skip_ws();
    if (p_ < end_ && *p_ == ']') {
      ++p_;
      return Value::array(std::move(arr));
    }
    for (;;) {
      skip_ws();
      arr.push_back(parse_value(depth + 1));
      skip_ws();
      if (p_ < end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ < end_ && *p_ == ']') {
        ++p_;
        return Value::array(std::move(arr));
      }
      fail("expected ',' or ']' in array");
    }
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  uint32_t parse_hex4() {
    if (end_ - p_ < 4) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i, ++p_) {
      const char c = *p_;
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("bad hex digit in \\u escape");
    }
    return v;
  }

  std::string parse_string() {
    ++p_;  // opening quote
    std::string out;
    for (;;) {
      if (p_ >= end_) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return out;
      }
      if (c < 0x20) fail("control character in string");
      if (c != '\\') {
        out += static_cast<char>(c);
        ++p_;
        continue;
      }
      ++p_;
      if (p_ >= end_) fail("unterminated escape");
      const char e = *p_++;
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by \u + a low surrogate (UTF-16 pair).
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') fail("unpaired surrogate in \\u escape");
            p_ += 2;
            const uint32_t lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("bad escape '\\") + e + "'");
      }
    }
  }

  Value parse_number() {
    // Grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const char* start = p_;
    bool integral = true;
    if (*p_ == '-') ++p_;
    if (p_ >= end_) fail("truncated number");
    if (*p_ == '0') {
      ++p_;
    } else if (*p_ >= '1' && *p_ <= '9') {
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    } else {
      fail("bad number");
    }
    if (p_ < end_ && *p_ == '.') {
      integral = false;
      ++p_;
      if (p_ >= end_ || *p_ < '0' || *p_ > '9') fail("bad number: digits must follow '.'");
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    if (p_ < end_ && (*p_ == 'e' || *p_ == 'E')) {
      integral = false;
      ++p_;
      if (p_ < end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ >= end_ || *p_ < '0' || *p_ > '9') fail("bad number: digits must follow the exponent");
      while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    }
    const std::string text(start, p_);
    if (integral) {
      errno = 0;
      char* endp = nullptr;
      const long long i = std::strtoll(text.c_str(), &endp, 10);
      if (errno != ERANGE && endp && *endp == '\0') return Value::integer(static_cast<int64_t>(i));
      // Too large for int64: kept as a double (not an exact integer).
    }
    const double d = std::strtod(text.c_str(), nullptr);
    // 1e999 overflows a double; JSON has no infinities and dump() could not write one back.
    if (!std::isfinite(d)) fail("number " + (text.size() > 40 ? text.substr(0, 40) + "..." : text) + " is out of range for a double");
    return Value::number(d);
  }
};

}  // namespace

Value parse(const char* data, size_t size) {
  return Parser(data, size).parse_document();
}

// ------------------------------------------------------------------ writer
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
  return out;
}

static void dump_to(std::string& out, const Value& v) {
  switch (v.type()) {
    case Value::Type::Null: out += "null"; break;
    case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Value::Type::Number: {
      if (v.is_integer()) {
        out += std::to_string(v.as_int64());
      } else {
        const double d = v.as_double();
        if (!std::isfinite(d)) throw std::runtime_error("JSON cannot hold a non-finite number");
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", d);
        out += buf;
        // "2" or "-0" would read back as an integer (and -0 as 0): keep it a double.
        if (std::strpbrk(buf, ".e") == nullptr) out += ".0";
      }
      break;
    }
    case Value::Type::String: out += quote(v.as_string()); break;
    case Value::Type::Array: {
      out += '[';
      bool first = true;
      for (const auto& e : v.as_array()) {
        if (!first) out += ',';
        first = false;
        dump_to(out, e);
      }
      out += ']';
      break;
    }
    case Value::Type::Object: {
      out += '{';
      bool first = true;
      for (const auto& kv : v.as_object()) {
        if (!first) out += ',';
        first = false;
        out += quote(kv.first);
        out += ':';
        dump_to(out, kv.second);
      }
      out += '}';
      break;
    }
  }
}

std::string dump(const Value& v) {
  std::string out;
  dump_to(out, v);
  return out;
}

}  // namespace json
}  // namespace arpo
