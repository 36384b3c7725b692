// Seeded mutation driver for the sanitised fuzz targets. A target defines
//   std::vector<std::string> fuzz_seeds();             // valid inputs
//   bool fuzz_one(const uint8_t* data, size_t size);   // true: accepted (and the
//       result checked); false: a clean rejection (checked by the target)
// and includes this header once. Case i applies 1-4 seeded edits (bit flips,
// interesting bytes, truncations, insertions, deletions, duplicated ranges,
// u64 length fields, JSON-aware number / nesting / duplicate-key edits) to a
// seed and runs fuzz_one on an exactly-sized heap copy, so AddressSanitizer
// sees any read past the input. A target signals a defect with fuzz_fail();
// any exception other than a clean rejection is a defect too.
//
//   <target> [--cases N] [--seed S] [--seconds T] [--case I]
// runs cases 0..N-1 (stopping after T seconds, default 60), or replays case I.
// Built with -DARPO_LIBFUZZER it instead exposes LLVMFuzzerTestOneInput for
// clang's libFuzzer (coverage-guided, from the same targets).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

std::vector<std::string> fuzz_seeds();
bool fuzz_one(const uint8_t* data, size_t size);

namespace arpo_fuzz {

// The case being run, for fuzz_fail's message.
inline uint64_t& current_seed() { static uint64_t s = 0; return s; }
inline int64_t& current_case() { static int64_t c = -1; return c; }

}  // namespace arpo_fuzz

// A defect: prints the case (replay with --seed S --case I) and aborts.
[[noreturn]] inline void fuzz_fail(const std::string& what) {
  std::fprintf(stderr, "FUZZ DEFECT (seed %llu, case %lld): %s\n",
               static_cast<unsigned long long>(arpo_fuzz::current_seed()),
               static_cast<long long>(arpo_fuzz::current_case()), what.c_str());
  std::abort();
}

// A clean rejection must be a std::runtime_error whose message starts with `prefix`.
inline void fuzz_expect_message(const std::exception& e, const std::string& prefix) {
  const std::string msg = e.what();
  if (msg.compare(0, prefix.size(), prefix) != 0)
    fuzz_fail("rejection \"" + msg.substr(0, 300) + "\" does not start with \"" + prefix + "\"");
}

namespace arpo_fuzz {

// splitmix64: one independent stream per (seed, case).
struct Rng {
  uint64_t state;
  Rng(uint64_t seed, uint64_t index) : state(seed * 0x9e3779b97f4a7c15ULL ^ (index + 1) * 0xbf58476d1ce4e5b9ULL) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (inclusive).
  size_t range(size_t lo, size_t hi) { return lo + static_cast<size_t>(next() % (hi - lo + 1)); }
  template <class T, size_t N>
  const T& pick(const T (&a)[N]) { return a[next() % N]; }
};

inline void mutate(Rng& rng, std::string& b) {
  static const unsigned char kBytes[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']', ',', ':', '-', 'e', '.'};
  static const char* const kNumbers[] = {"0", "-1", "1e999", "-0", "NaN", "Infinity", "1.5", "18446744073709551616",
                                         "9223372036854775807", "9223372036854775808", "-9223372036854775809",
                                         "4294967296", "1e-400", "00", "0x10", "99999999999999999999999"};
  static const uint64_t kU64[] = {0, 1, 7, 8, 0xffffffffULL, 0x7fffffffffffffffULL, 0xffffffffffffffffULL, 100000001};
  const int edits = 1 + static_cast<int>(rng.range(0, 3));
  for (int e = 0; e < edits; ++e) {
    const size_t at = b.empty() ? 0 : rng.range(0, b.size() - 1);
    switch (rng.range(0, 9)) {
      case 0:  // bit flip
        if (!b.empty()) b[at] = static_cast<char>(b[at] ^ (1 << rng.range(0, 7)));
        break;
      case 1:  // interesting byte
        if (!b.empty()) b[at] = static_cast<char>(rng.pick(kBytes));
        break;
      case 2:  // truncate
        b.resize(at);
        break;
      case 3: {  // insert random bytes
        std::string ins(rng.range(1, 16), '\0');
        for (auto& c : ins) c = static_cast<char>(rng.range(0, 255));
        b.insert(at, ins);
        break;
      }
      case 4:  // delete a range
        b.erase(at, rng.range(1, 32));
        break;
      case 5: {  // duplicate a range
        const std::string piece = b.substr(at, rng.range(1, 64));
        b.insert(std::min(b.size(), at + piece.size()), piece);
        break;
      }
      case 6:  // a u64 little-endian field (lengths, counts)
        if (b.size() >= 8) {
          const uint64_t v = rng.next() % 4 == 0 ? rng.next() % (1u << 30) : rng.pick(kU64);
          const size_t pos = rng.next() % 2 == 0 ? 0 : rng.range(0, b.size() - 8);
          for (int i = 0; i < 8; ++i) b[pos + i] = static_cast<char>(v >> (8 * i));
        }
        break;
      case 7: {  // replace the number literal at or after `at`
        size_t s = at;
        while (s < b.size() && !(b[s] >= '0' && b[s] <= '9')) ++s;
        if (s >= b.size()) break;
        size_t t = s;
        while (t < b.size() && ((b[t] >= '0' && b[t] <= '9') || b[t] == '.' || b[t] == 'e' || b[t] == '-' || b[t] == '+')) ++t;
        b.replace(s, t - s, rng.pick(kNumbers));
        break;
      }
      case 8: {  // deep nesting in place of a value
        const size_t depth = rng.next() % 2 == 0 ? rng.range(200, 300) : rng.range(1000, 20000);
        const bool arr = rng.next() % 2 == 0;
        std::string deep;
        for (size_t i = 0; i < depth; ++i) deep += arr ? "[" : "{\"a\":";
        deep += "1";
        for (size_t i = 0; i < depth; ++i) deep += arr ? "]" : "}";
        b.insert(at, deep);
        break;
      }
      default: {  // duplicate the "key": at or after `at` (a duplicate key)
        const size_t q = b.find('"', at);
        if (q == std::string::npos) break;
        const size_t colon = b.find("\":", q + 1);
        if (colon == std::string::npos || colon - q > 64) break;
        const std::string key = b.substr(q, colon + 2 - q);
        b.insert(q, key + "0,");
        break;
      }
    }
  }
}

// Runs case `index`; returns whether the target accepted the input.
inline bool run_case(const std::vector<std::string>& seeds, uint64_t seed, int64_t index) {
  current_case() = index;
  Rng rng(seed, static_cast<uint64_t>(index));
  std::string input = seeds[rng.next() % seeds.size()];
  if (index % 16 != 0) mutate(rng, input);  // every 16th case runs a seed unchanged
  // An exactly-sized heap copy: ASan flags a read one byte past the input.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[input.size() ? input.size() : 1]);
  if (!input.empty()) std::memcpy(copy.get(), input.data(), input.size());
  try {
    return fuzz_one(copy.get(), input.size());
  } catch (const std::exception& e) {
    fuzz_fail(std::string("uncaught exception from the target: ") + e.what());
  }
}

}  // namespace arpo_fuzz

#ifdef ARPO_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)fuzz_one(data, size);
  return 0;
}
#else
int main(int argc, char** argv) {
  int64_t cases = 10000, only = -1;
  uint64_t seed = 20261203;
  double seconds = 60;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--cases") cases = std::atoll(argv[i + 1]);
    else if (a == "--seed") seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--seconds") seconds = std::atof(argv[i + 1]);
    else if (a == "--case") only = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s (use --cases N --seed S --seconds T --case I)\n", a.c_str());
      return 2;
    }
  }
  arpo_fuzz::current_seed() = seed;
  const std::vector<std::string> seeds = fuzz_seeds();
  // The seeds themselves must parse: a target whose seeds are rejected fuzzes nothing.
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::unique_ptr<uint8_t[]> copy(new uint8_t[seeds[i].size() + 1]);
    std::memcpy(copy.get(), seeds[i].data(), seeds[i].size());
    arpo_fuzz::current_case() = -1 - static_cast<int64_t>(i);
    if (!fuzz_one(copy.get(), seeds[i].size())) fuzz_fail("seed " + std::to_string(i) + " is rejected");
  }
  if (only >= 0) {
    arpo_fuzz::run_case(seeds, seed, only);
    std::printf("case %lld passed\n", static_cast<long long>(only));
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  int64_t i = 0, accepted = 0;
  for (; i < cases; ++i) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) break;
    accepted += arpo_fuzz::run_case(seeds, seed, i) ? 1 : 0;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%lld cases passed: %lld accepted, %lld rejected cleanly (seed %llu, %.1f s)\n", static_cast<long long>(i),
              static_cast<long long>(accepted), static_cast<long long>(i - accepted), static_cast<unsigned long long>(seed), s);
  // Both outcomes must occur: mutations that reach past the first check, seeds that stay valid.
  if (i >= 100 && (accepted == 0 || accepted == i)) {
    std::fprintf(stderr, "FUZZ: every case was %s; the mutations or the seeds are broken\n", accepted ? "accepted" : "rejected");
    return 1;
  }
  if (i < std::min<int64_t>(cases, 1000)) {
    std::fprintf(stderr, "FUZZ: only %lld cases ran in %.0f s (want at least %lld)\n", static_cast<long long>(i), seconds,
                 static_cast<long long>(std::min<int64_t>(cases, 1000)));
    return 1;
  }
  return 0;
}
#endif
