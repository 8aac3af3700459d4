// dtrain's environment variables, each declared once with its type, default and doc line in
// core/params.def (NCCL's NCCL_PARAM habit); docs/environment.md is generated from it.
//
//     const int64_t spin = param::kShmSpinUs.get();              // the default when unset
//     if (auto path = param::kTimeline.get_if_set()) open(*path);  // nullopt when unset or ""
//     bool stats = param::kShmStats.get();
//
// A malformed value throws UsageError naming the variable, what it holds and what it expects:
//     DTRAIN_SHM_SPIN_US='fast' is not an integer >= 0; fix or unset it
// Where an exception cannot go (a destructor, a static initializer, an atexit handler),
// get_or_warn() prints that message as a warning to stderr and returns the default instead.
// A variable of another project's contract (LOCAL_RANK, ...) is read the same way through a
// local object: `param::Int{"LOCAL_RANK", -1, 0}.get()`. Thread-safe as getenv is (the
// getters read the environment on every call and keep nothing).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dtrain::param {

// Who sets a variable (the table's "set by" column).
enum class Who { kUser, kWorkers, kInternal };

struct String {
  const char* name;
  const char* fallback;
  int unused_min = 0;
  std::optional<std::string> get_if_set() const;  // nullopt when unset or empty
  std::string get() const;                        // the fallback when unset or empty
};

struct Int {
  const char* name;
  int64_t fallback;
  int64_t min;  // a set value below it is malformed (the fallback may be below it)
  std::optional<int64_t> get_if_set() const;
  int64_t get() const;
  int64_t get_or_warn() const noexcept;
};

struct Double {
  const char* name;
  double fallback;
  double min;
  std::optional<double> get_if_set() const;
  double get() const;
  double get_or_warn() const noexcept;
};

struct Bool {
  const char* name;
  bool fallback;
  int unused_min = 0;
  std::optional<bool> get_if_set() const;  // 1/0, true/false, yes/no, on/off (any case)
  bool get() const;
  bool get_or_warn() const noexcept;
};

#define DTRAIN_PARAM(id, type, name, fallback, min, who, guide, doc) \
  inline constexpr type id{name, fallback, min};
#include "core/params.def"
#undef DTRAIN_PARAM

// The declarations as text, in params.def's order: what docs/environment.md's table shows.
struct Info {
  const char* name;
  const char* type;
  const char* fallback;  // as written in params.def
  const char* min;       // likewise (Int, Double: a set value's least)
  Who who;
  const char* guide;
  const char* doc;
};
inline constexpr Info kAll[] = {
#define DTRAIN_PARAM(id, type, name, fallback, min, who, guide, doc) \
  {name, #type, #fallback, #min, Who::who, guide, doc},
#include "core/params.def"
#undef DTRAIN_PARAM
};

}  // namespace dtrain::param
