// dtrain's error types.
//
// Two tiers, as in c10: typed exceptions for what the caller or the world did wrong
// (bad arguments, a peer that went away, a wait that timed out), each message saying what
// was expected, what was found and what to do; and DTRAIN_ASSERT for dtrain's own broken
// invariants.
#pragma once

#include <stdexcept>
#include <string>

namespace dtrain {

// Base of every error dtrain throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The caller passed something invalid (a flag, an option, a config value).
// The launcher maps it to exit code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

// A socket could not be bound, connected, read or written.
class NetworkError : public Error {
 public:
  using Error::Error;
};

// The port asked for is taken by another process.
class AddressInUseError : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

// The store answered something unexpected, or a key was missing.
class StoreError : public Error {
 public:
  using Error::Error;
};

// A blocking wait ran out of time.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A broken invariant: a bug in dtrain, not in the caller's code.
class InternalError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_internal(const char* file, int line, const char* cond,
                                 const std::string& msg);

}  // namespace dtrain

#define DTRAIN_ASSERT(cond, msg)                                             \
  do {                                                                       \
    if (!(cond)) ::dtrain::throw_internal(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
