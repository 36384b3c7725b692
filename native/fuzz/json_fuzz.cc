// Fuzz target: the JSON parser (format/json.cc) that reads safetensors
// headers, config.json and index files. An accepted input must dump to text
// that parses back to the same dump (a value the parser admits can be
// written); a rejection must be a json::ParseError naming the byte offset.
#include <cmath>

#include "driver.h"
#include "format/json.h"

namespace json = arpo::json;

std::vector<std::string> fuzz_seeds() {
  return {
      R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":64,"num_attention_heads":4,"rope_theta":1000000.0,)"
      R"("rms_norm_eps":1e-06,"tie_word_embeddings":true,"torch_dtype":"float32","sliding_window":null})",
      R"({"__metadata__":{"format":"pt"},"a.weight":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]}})",
      R"(["esc \"q\" \\ \/ \b\f\n\r\t", "\u00e9\u4e2d\ud83d\ude00", -0, 0.5, -1.25e-3, 9007199254740993, true, false, null])",
      R"({"weight_map":{"x":"model-00001-of-00002.safetensors","y":"model-00002-of-00002.safetensors"},"metadata":{"total_size":12}})",
      "  [[[[[[[[[[{\"deep\":[]}]]]]]]]]]]  ",
      "{}",
  };
}

static int depth_of(const json::Value& v) {
  int d = 0;
  if (v.is_array())
    for (const auto& e : v.as_array()) d = std::max(d, depth_of(e));
  if (v.is_object())
    for (const auto& kv : v.as_object()) d = std::max(d, depth_of(kv.second));
  return v.is_array() || v.is_object() ? d + 1 : 0;
}

bool fuzz_one(const uint8_t* data, size_t size) {
  json::Value v;
  try {
    v = json::parse(reinterpret_cast<const char*>(data), size);
  } catch (const json::ParseError& e) {
    fuzz_expect_message(e, "invalid JSON at byte ");
    return false;
  }
  if (depth_of(v) > 256) fuzz_fail("accepted nesting deeper than 256 levels");
  std::string text;
  try {
    text = json::dump(v);
  } catch (const std::exception& e) {
    fuzz_fail(std::string("an accepted value cannot be dumped: ") + e.what());
  }
  json::Value back;
  try {
    back = json::parse(text);
  } catch (const std::exception& e) {
    fuzz_fail(std::string("the dump of an accepted value does not parse: ") + e.what());
  }
  if (json::dump(back) != text) fuzz_fail("dump -> parse -> dump changed the text: " + text.substr(0, 200));
  // Objects keep duplicate-free keys.
  std::vector<const json::Value*> stack{&v};
  while (!stack.empty()) {
    const json::Value* cur = stack.back();
    stack.pop_back();
    if (cur->is_array())
      for (const auto& e : cur->as_array()) stack.push_back(&e);
    if (cur->is_object()) {
      const auto& o = cur->as_object();
      for (size_t i = 0; i < o.size(); ++i) {
        for (size_t j = 0; j < i; ++j)
          if (o[i].first == o[j].first) fuzz_fail("accepted a duplicate key " + json::quote(o[i].first));
        stack.push_back(&o[i].second);
      }
    }
    if (cur->is_number() && !std::isfinite(cur->as_double())) fuzz_fail("accepted a non-finite number");
  }
  return true;
}
