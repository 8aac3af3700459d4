// What every fuzz target checks beyond "no crash, no leak, no sanitizer report": bad input
// ends in one of dtrain's typed errors (a message that names what was wrong), never in
// another exception - a library's parse_error, std::out_of_range from a stoi, a c10::Error.
//
// Each target is one file defining LLVMFuzzerTestOneInput. It is built twice: with libFuzzer
// and the sanitizers by scripts/fuzz.sh (clang), and into the normal test suite by
// tests/fuzz/fuzz.cmake, where replay_main.cpp runs it over its seed corpus and the
// regression inputs (tests/fuzz/corpus/TARGET, tests/fuzz/regressions/TARGET).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

#include "dtrain/error.h"

namespace dtrain::fuzz {

// Runs f; returns true if it returned, false if it threw a dtrain::Error (the input was
// refused properly). Any other exception is a finding: it is printed and the process aborts,
// which libFuzzer reports as a crash with the input that caused it.
template <typename F>
bool refused_properly(F&& f) {
  try {
    f();
    return true;
  } catch (const InternalError& e) {
    std::fprintf(stderr, "fuzz: DTRAIN_ASSERT fired (a dtrain bug): %s\n", e.what());
    std::abort();
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: bad input escaped as %s instead of a dtrain error: %s\n",
                 typeid(e).name(), e.what());
    std::abort();
  }
}

// Reads the fuzz input front to back: numbers and strings, empty/zero once it ran out.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  std::uint8_t byte() { return pos_ < size_ ? static_cast<std::uint8_t>(data_[pos_++]) : 0; }
  // Up to `max` bytes: a length byte, then that many.
  std::string_view bytes(std::size_t max = 255) {
    std::size_t n = std::min<std::size_t>(byte(), max);
    n = std::min(n, size_ - pos_);
    std::string_view s(data_ + pos_, n);
    pos_ += n;
    return s;
  }
  std::string_view rest() {
    std::string_view s(data_ + pos_, size_ - pos_);
    pos_ = size_;
    return s;
  }
  bool empty() const { return pos_ >= size_; }

 private:
  const char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
};

}  // namespace dtrain::fuzz
