// Minimal test harness for the C++ kernel tests: CHECK / CHECK_CLOSE /
// CHECK_THROWS record failures, print the first few mismatches, and
// check_summary() prints "N passed, M failed" and returns the exit code.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace arpo_test {

inline int& passed() { static int n = 0; return n; }
inline int& failed() { static int n = 0; return n; }
constexpr int kMaxReports = 8;

inline void report(bool ok, const char* file, int line, const std::string& what) {
  if (ok) {
    ++passed();
    return;
  }
  if (failed() < kMaxReports) std::fprintf(stderr, "FAIL %s:%d: %s\n", file, line, what.c_str());
  ++failed();
}

// |ref - out| <= atol + rtol * |ref|; equal infinities and NaN == NaN count as close.
inline bool close(double out, double ref, double atol, double rtol) {
  if (std::isnan(ref) || std::isnan(out)) return std::isnan(ref) && std::isnan(out);
  if (std::isinf(ref) || std::isinf(out)) return out == ref;
  return std::fabs(ref - out) <= atol + rtol * std::fabs(ref);
}

inline int summary() {
  std::printf("%d passed, %d failed\n", passed(), failed());
  return failed() == 0 ? 0 : 1;
}

}  // namespace arpo_test

#define CHECK(cond) ::arpo_test::report((cond), __FILE__, __LINE__, #cond)

#define CHECK_CLOSE(out, ref, atol, rtol)                                                          \
  do {                                                                                             \
    const double check_o_ = (out), check_r_ = (ref);                                               \
    ::arpo_test::report(::arpo_test::close(check_o_, check_r_, (atol), (rtol)), __FILE__, __LINE__, \
                        std::string(#out) + " = " + std::to_string(check_o_) + " vs ref " +       \
                            std::to_string(check_r_));                                             \
  } while (0)

// Expects `expr` to throw an exception whose message contains `needle`.
#define CHECK_THROWS(expr, needle)                                                                 \
  do {                                                                                             \
    std::string check_msg_ = "<no exception>";                                                     \
    try {                                                                                          \
      expr;                                                                                        \
    } catch (const std::exception& check_e_) {                                                     \
      check_msg_ = check_e_.what();                                                                \
    }                                                                                              \
    ::arpo_test::report(check_msg_.find(needle) != std::string::npos, __FILE__, __LINE__,          \
                        std::string(#expr) + " should throw \"" + (needle) + "\", got: " + check_msg_); \
  } while (0)

namespace arpo_test {

// One check over n values: prints the first few mismatches (index, out, ref).
template <typename Out, typename Ref>
inline void check_array(const char* file, int line, const std::string& name, const Out* out, const Ref* ref, long n,
                        double atol, double rtol) {
  long bad = 0;
  for (long i = 0; i < n; ++i) {
    if (close(static_cast<double>(out[i]), static_cast<double>(ref[i]), atol, rtol)) continue;
    if (bad < 5)
      std::fprintf(stderr, "  %s[%ld]: out %.9g ref %.9g (|diff| %.3g)\n", name.c_str(), i, static_cast<double>(out[i]),
                   static_cast<double>(ref[i]), std::fabs(static_cast<double>(out[i]) - static_cast<double>(ref[i])));
    ++bad;
  }
  report(bad == 0, file, line, name + ": " + std::to_string(bad) + " of " + std::to_string(n) + " values differ");
}

}  // namespace arpo_test

#define CHECK_ARRAY(name, out, ref, n, atol, rtol) ::arpo_test::check_array(__FILE__, __LINE__, (name), (out), (ref), (n), (atol), (rtol))
