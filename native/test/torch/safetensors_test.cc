// Tests of native/torch/safetensors + json: exact on-disk bytes against a
// hand-built reference file, bit-identical round trips over every dtype,
// sharded checkpoints, and every malformed header -> a clear error, no crash.
// Prints one line per failure and ends with "N passed, M failed".
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "format/json.h"
#include "torch/safetensors.h"

namespace st = arpo::st;
namespace json = arpo::json;

static int g_passed = 0;
static int g_failed = 0;

static void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::cout << "FAIL: " << what << "\n";
  }
}

// Runs fn, expecting a std::runtime_error whose message contains every needle.
static void expect_error(const std::string& what, const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) {
      if (msg.find(n) == std::string::npos) {
        check(false, what + ": message \"" + msg + "\" lacks \"" + n + "\"");
        return;
      }
    }
    check(true, what);
    return;
  }
  check(false, what + ": no exception");
}

static std::string tmp_root() {
  static std::string root;
  if (root.empty()) {
    char tmpl[] = "/tmp/arpo-st-test-XXXXXX";
    root = ::mkdtemp(tmpl);
  }
  return root;
}

static void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

static std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

static std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A file from a header string and data bytes (no padding: the reader must not need it).
static std::string make_file(const std::string& header, const std::string& data) {
  return u64le(header.size()) + header + data;
}

static bool bit_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto ac = a.contiguous();
  const auto bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

static void test_json() {
  const auto v = json::parse(" {\"a\": [1, -2, 3.5e1, true, null], \"s\": \"x\\u00e9\\ud83d\\ude00\\n\"} ");
  check(v.is_object() && v.as_object().size() == 2, "json: object with two keys");
  check(v.find("a")->as_array()[1].as_int64() == -2, "json: negative integer");
  check(v.find("a")->as_array()[2].as_double() == 35.0 && !v.find("a")->as_array()[2].is_integer(),
        "json: exponent literal is a double, not an exact integer");
  check(v.find("s")->as_string() == "x\xc3\xa9\xf0\x9f\x98\x80\n", "json: \\u escapes and surrogate pair decode to UTF-8");
  check(json::parse("9007199254740993").as_int64() == 9007199254740993LL, "json: integers above 2^53 stay exact");
  check(json::dump(json::parse("{\"k\":[1,2.5,\"a\\\"b\"]}")) == "{\"k\":[1,2.5,\"a\\\"b\"]}", "json: dump round trip");
  for (const char* bad : {"", "{", "{\"a\":1,}", "[1 2]", "01", "1.", "\"\\x\"", "{\"a\":1} x", "{\"a\":1,\"a\":2}",
                          "\"\\ud800\"", "tru", "\"a\nb\""}) {
    expect_error(std::string("json: rejects ") + json::quote(bad), [&] { json::parse(bad); }, {"invalid JSON at byte"});
  }
  // Found by native/fuzz/json_fuzz: a number beyond double range was accepted as
  // inf (which dump() then refused), and a whole-valued double such as -0.0
  // dumped as "-0", which read back as the integer 0.
  expect_error("json: 1e999 is out of range", [] { json::parse("[1e999]"); }, {"invalid JSON at byte", "1e999", "out of range"});
  expect_error("json: a 400-digit integer is out of range", [] { json::parse(std::string(400, '9')); }, {"out of range"});
  check(json::dump(json::Value::number(-0.0)) == "-0.0" && std::signbit(json::parse("-0.0").as_double()), "json: -0.0 round trips");
  check(json::dump(json::Value::number(2)) == "2.0" && !json::parse("2.0").is_integer(), "json: a whole double stays a double");
  check(json::dump(json::parse("[1e300,0.1]")) == "[1.0000000000000001e+300,0.10000000000000001]", "json: doubles dump with 17 digits");
  expect_error("json: nesting limit", [] { json::parse(std::string(1000, '[') + std::string(1000, ']')); }, {"nesting"});
}

static void test_exact_bytes() {
  // Reference layout (huggingface/safetensors serialize): compact JSON,
  // "__metadata__" first, tensors by name, spaces pad the header to 8 bytes.
  const std::string path = tmp_root() + "/exact.safetensors";
  torch::Tensor b = torch::tensor({1.0f, -2.5f});
  torch::Tensor a = torch::tensor({int64_t{7}}, torch::kInt64);
  st::save_safetensors(path, {{"b", b}, {"a", a}}, {{"format", "pt"}});
  std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
  header.append((8 - header.size() % 8) % 8, ' ');
  const char data[] = {7, 0, 0, 0, 0, 0, 0, 0,                     // int64 7
                       0x00, 0x00, (char)0x80, 0x3F,               // 1.0f  = 0x3F800000
                       0x00, 0x00, 0x20, (char)0xC0};              // -2.5f = 0xC0200000
  const std::string expected = u64le(header.size()) + header + std::string(data, sizeof data);
  check(read_bytes(path) == expected, "writer: bytes equal the hand-built reference file");
  check(access((path + ".tmp-" + std::to_string(getpid())).c_str(), F_OK) != 0, "writer: no temporary file left");

  const auto f = st::SafetensorsFile::open(path);
  check(f->metadata().size() == 1 && f->metadata().at("format") == "pt", "reader: metadata");
  check(f->tensors().at("b").begin == 8 && f->tensors().at("b").end == 16 && f->tensors().at("b").dtype == "F32",
        "reader: tensor info");
  const auto lb = f->load("b");
  check(lb.scalar_type() == torch::kFloat32 && lb[0].item<float>() == 1.0f && lb[1].item<float>() == -2.5f,
        "reader: values from the hand-built bytes");
  check(f->load("a").item<int64_t>() == 7, "reader: int64 value");
}

static void test_round_trip() {
  torch::manual_seed(1234);
  std::vector<std::pair<std::string, torch::Tensor>> ts = {
      {"model.embed_tokens.weight", torch::randn({7, 5})},
      {"f64", torch::randn({3, 2}, torch::kFloat64)},
      {"bf16", torch::randn({4, 3}).to(torch::kBFloat16)},
      {"f16", torch::randn({2, 9}).to(torch::kFloat16)},
      {"i64", torch::randint(-1000000000000LL, 1000000000000LL, {6}, torch::kInt64)},
      {"i32", torch::randint(-100000, 100000, {2, 2, 2}, torch::kInt32)},
      {"i16", torch::randint(-30000, 30000, {3}, torch::kInt16)},
      {"i8", torch::randint(-100, 100, {5}, torch::kInt8)},
      {"u8", torch::randint(0, 255, {5}, torch::kUInt8)},
      {"bool", torch::randint(0, 2, {4}, torch::kInt64).to(torch::kBool)},
      {"scalar", torch::tensor(3.25f).reshape({})},
      {"empty", torch::empty({0, 4})},
      {"noncontig", torch::randn({4, 6}).t()},
  };
  const std::string path = tmp_root() + "/rt.safetensors";
  st::save_safetensors(path, ts, {{"k", "v"}});
  const auto f = st::SafetensorsFile::open(path);
  check(f->tensors().size() == ts.size(), "round trip: tensor count");
  for (const auto& kv : ts) check(f->contains(kv.first) && bit_equal(f->load(kv.first), kv.second), "round trip bit-identical: " + kv.first);
  // Saving what was loaded reproduces the file byte for byte.
  std::vector<std::pair<std::string, torch::Tensor>> again;
  for (const auto& kv : f->tensors()) again.emplace_back(kv.first, f->load(kv.first));
  const std::string path2 = tmp_root() + "/rt2.safetensors";
  st::save_safetensors(path2, again, f->metadata());
  check(read_bytes(path) == read_bytes(path2), "round trip: re-save is byte-identical");
  const auto header_len = read_bytes(path).substr(0, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(header_len[i]);
  check(n % 8 == 0, "writer: header length padded to a multiple of 8");

  // Conversion on load: BF16 on disk -> float32 equals libtorch's own cast.
  const auto bf = f->load("bf16", torch::kFloat32);
  check(bf.scalar_type() == torch::kFloat32 && bit_equal(bf, ts[2].second.to(torch::kFloat32)), "load: BF16 -> F32 conversion");
  const auto hf = f->load("model.embed_tokens.weight", torch::kBFloat16);
  check(bit_equal(hf, ts[0].second.to(torch::kBFloat16)), "load: F32 -> BF16 conversion");

  // Overwriting an existing file goes through the same rename.
  st::save_safetensors(path, {{"x", torch::ones({2})}});
  check(st::SafetensorsFile::open(path)->tensors().size() == 1, "writer: replaces an existing file");
  expect_error("writer: duplicate names", [&] { st::save_safetensors(path, {{"x", torch::ones({1})}, {"x", torch::ones({1})}}); },
               {"tensor \"x\"", "given twice"});
  expect_error("writer: reserved name", [&] { st::save_safetensors(path, {{"__metadata__", torch::ones({1})}}); }, {"__metadata__"});
  expect_error("writer: unwritable directory", [&] { st::save_safetensors("/nonexistent-dir/x.safetensors", {{"x", torch::ones({1})}}); },
               {"/nonexistent-dir/x.safetensors.tmp-", "open failed"});
}

static void test_malformed() {
  const std::string dir = tmp_root();
  const std::string good_header = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  const std::string data8(8, '\x01');
  auto open_bytes = [&](const std::string& name, const std::string& bytes) {
    const std::string path = dir + "/" + name;
    write_bytes(path, bytes);
    return [path] { st::SafetensorsFile::open(path); };
  };

  expect_error("missing file", [&] { st::SafetensorsFile::open(dir + "/nope.safetensors"); }, {"nope.safetensors", "open failed"});
  expect_error("file shorter than 8 bytes", open_bytes("short.safetensors", "abc"), {"short.safetensors", "too short"});
  expect_error("header length beyond the file", open_bytes("trunc_header.safetensors", u64le(500) + good_header),
               {"trunc_header.safetensors", "header length 500 exceeds"});
  expect_error("header length over 100 MB", open_bytes("huge.safetensors", u64le(200000000) + good_header), {"huge.safetensors", "limit"});
  expect_error("truncated data section", open_bytes("trunc_data.safetensors", make_file(good_header, data8.substr(0, 5))),
               {"trunc_data.safetensors", "tensor \"w\"", "data_offsets [0, 8] exceed the data section of 5 bytes"});
  expect_error("bad JSON", open_bytes("badjson.safetensors", make_file("{\"w\": {\"dtype\": ", data8)), {"badjson.safetensors", "not valid JSON"});
  expect_error("header not an object", open_bytes("arr.safetensors", make_file("{}", "") .substr(0, 8) + "[]      "), {"arr.safetensors"});
  expect_error("unknown dtype",
               open_bytes("dtype.safetensors", make_file("{\"w\":{\"dtype\":\"F7\",\"shape\":[2],\"data_offsets\":[0,8]}}", data8)),
               {"dtype.safetensors", "tensor \"w\"", "unknown dtype \"F7\""});
  expect_error("negative shape",
               open_bytes("neg.safetensors", make_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", data8)),
               {"neg.safetensors", "tensor \"w\"", "non-negative"});
  expect_error("fractional shape",
               open_bytes("frac.safetensors", make_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", data8)),
               {"frac.safetensors", "non-negative integers"});
  expect_error("wrong byte length",
               open_bytes("len.safetensors", make_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", data8)),
               {"len.safetensors", "tensor \"w\"", "hold 8 bytes", "need 12"});
  expect_error("reversed offsets",
               open_bytes("rev.safetensors", make_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", data8)),
               {"rev.safetensors", "end before they begin"});
  expect_error("offsets of the wrong arity",
               open_bytes("arity.safetensors", make_file("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", data8)),
               {"arity.safetensors", "[begin, end]"});
  expect_error("missing dtype", open_bytes("nodtype.safetensors", make_file("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", data8)),
               {"nodtype.safetensors", "\"dtype\""});
  expect_error("overflowing shape",
               open_bytes("ovf.safetensors",
                          make_file("{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", data8)),
               {"ovf.safetensors", "overflows"});
  expect_error("overlapping tensors",
               open_bytes("overlap.safetensors",
                          make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                    "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                                    data8)),
               {"overlap.safetensors", "tensor \"b\"", "overlap tensor \"a\""});
  expect_error("metadata value not a string",
               open_bytes("meta.safetensors", make_file("{\"__metadata__\":{\"n\":1}}", "")), {"meta.safetensors", "__metadata__"});
  // Gaps between tensors are allowed (only overlaps are fatal).
  const std::string gap = dir + "/gap.safetensors";
  write_bytes(gap, make_file("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]},"
                             "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
                             std::string("\x01\x02xxxx\x03\x04", 8)));
  try {
    const auto f = st::SafetensorsFile::open(gap);
    check(f->load("a")[1].item<uint8_t>() == 4 && f->load("b")[0].item<uint8_t>() == 1, "gaps between tensors are allowed");
  } catch (const std::exception& e) {
    check(false, std::string("gaps between tensors are allowed: ") + e.what());
  }
  expect_error("load of an absent tensor", [&] { st::SafetensorsFile::open(gap)->load("zz"); }, {"gap.safetensors", "tensor \"zz\"", "not in this file"});
}

static void test_checkpoint_dirs() {
  const std::string single = tmp_root() + "/single";
  const std::string sharded = tmp_root() + "/sharded";
  ::mkdir(single.c_str(), 0755);
  ::mkdir(sharded.c_str(), 0755);
  torch::manual_seed(7);
  const auto a = torch::randn({3, 4});
  const auto b = torch::randn({5}).to(torch::kBFloat16);
  const auto c = torch::randn({2, 2});
  st::save_safetensors(single + "/model.safetensors", {{"c", c}, {"a", a}, {"b", b}});
  auto all = st::load_checkpoint(single);
  check(all.size() == 3 && all[0].first == "a" && all[1].first == "b" && all[2].first == "c", "load_checkpoint: single file, sorted");
  check(bit_equal(all[0].second, a) && bit_equal(all[1].second, b), "load_checkpoint: single file values");
  auto as_f32 = st::load_checkpoint(single, torch::kFloat32);
  check(as_f32[1].second.scalar_type() == torch::kFloat32 && bit_equal(as_f32[1].second, b.to(torch::kFloat32)),
        "load_checkpoint: dtype conversion");

  st::save_safetensors(sharded + "/model-00001-of-00002.safetensors", {{"a", a}, {"c", c}});
  st::save_safetensors(sharded + "/model-00002-of-00002.safetensors", {{"b", b}});
  write_bytes(sharded + "/model.safetensors.index.json",
              "{\"metadata\":{\"total_size\":70},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
              "\"b\":\"model-00002-of-00002.safetensors\",\"c\":\"model-00001-of-00002.safetensors\"}}");
  auto sh = st::load_checkpoint(sharded);
  check(sh.size() == 3 && sh[0].first == "a" && bit_equal(sh[1].second, b) && bit_equal(sh[2].second, c), "load_checkpoint: sharded");
  std::vector<std::string> visited;
  st::visit_checkpoint(sharded, [&](const std::string& name, const torch::Tensor& t) {
    visited.push_back(name);
    if (name == "b") check(t.scalar_type() == torch::kFloat32 && bit_equal(t, b.to(torch::kFloat32)), "visit_checkpoint: converted value");
  }, torch::kFloat32);
  check(visited == std::vector<std::string>({"a", "b", "c"}), "visit_checkpoint: every tensor once, in name order");

  write_bytes(sharded + "/model.safetensors.index.json", "{\"weight_map\":{\"b\":\"model-00001-of-00002.safetensors\"}}");
  expect_error("sharded: tensor missing from its shard", [&] { st::load_checkpoint(sharded); },
               {"model.safetensors.index.json", "tensor \"b\"", "does not contain it"});
  int calls = 0;
  write_bytes(sharded + "/model.safetensors.index.json",
              "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"z\":\"model-00001-of-00002.safetensors\"}}");
  expect_error("sharded: a bad index fails before any tensor is visited",
               [&] { st::visit_checkpoint(sharded, [&](const std::string&, const torch::Tensor&) { ++calls; }); }, {"tensor \"z\""});
  check(calls == 0, "sharded: nothing visited before the index error");
  write_bytes(sharded + "/model.safetensors.index.json", "{\"weight_map\":{\"b\":\"../single/model.safetensors\"}}");
  expect_error("sharded: shard path escaping the directory", [&] { st::load_checkpoint(sharded); }, {"not a plain file name"});
  write_bytes(sharded + "/model.safetensors.index.json", "{\"weight_map\":{\"b\":\"model-00009.safetensors\"}}");
  expect_error("sharded: missing shard", [&] { st::load_checkpoint(sharded); }, {"model-00009.safetensors", "open failed"});
  write_bytes(sharded + "/model.safetensors.index.json", "{\"weights\":{}}");
  expect_error("sharded: no weight_map", [&] { st::load_checkpoint(sharded); }, {"weight_map"});
  expect_error("no checkpoint files", [&] { st::load_checkpoint(tmp_root() + "/nothing-here"); },
               {"nothing-here", "no model.safetensors or model.safetensors.index.json"});
}

int main() {
  const std::vector<std::pair<const char*, void (*)()>> tests = {
      {"json", test_json}, {"exact_bytes", test_exact_bytes}, {"round_trip", test_round_trip},
      {"malformed", test_malformed}, {"checkpoint_dirs", test_checkpoint_dirs}};
  for (const auto& t : tests) {
    try {
      t.second();
    } catch (const std::exception& e) {
      check(false, std::string(t.first) + ": unexpected exception: " + e.what());
    }
  }
  std::string cmd = "rm -rf '" + tmp_root() + "'";
  if (std::system(cmd.c_str()) != 0) std::cout << "warning: could not remove " << tmp_root() << "\n";
  std::cout << g_passed << " passed, " << g_failed << " failed\n";
  return g_failed == 0 ? 0 : 1;
}
