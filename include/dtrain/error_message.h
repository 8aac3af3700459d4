// What an exception says, for a person: a training program's catch-all prints this, not what().
//
// libtorch's errors (c10::Error: CUDA out of memory, a shape mismatch, a device mismatch) append
// the C++ stack trace of where they were raised to what(); error_message() leaves it out.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace dtrain {

inline std::string error_message(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace dtrain
