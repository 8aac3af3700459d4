// What several engines share: reading a task's place from the environment, addresses, and
// ClusterOptions' two spellings of an engine's settings.
#pragma once

#include <optional>
#include <string>

#include "dtrain/engine_env.h"
#include "dtrain/error.h"

namespace dtrain::engines {

// ---- a task's place from an engine's variables (task_from_env) ----
std::optional<std::string> get(const EnvLookup& env, const char* name);
// A non-negative int, or a UsageError naming the variable and `engine` (who sets it).
int to_int(const char* name, const std::string& v, const char* engine);
std::optional<int> get_int(const EnvLookup& env, const char* name, const char* engine);
int require_int(const EnvLookup& env, const char* name, const char* engine);
// UsageError unless 0 <= rank < world and 0 <= local_rank < local_world <= world.
void check_rank(const std::string& engine, int rank, int world, int local_rank, int local_world);
// MASTER_ADDR / MASTER_PORT, when set, win over what the engine says.
void master_from_env(const EnvLookup& env, EngineTask& t);

// ---- addresses ----
bool is_loopback_address(const std::string& addr);  // 127.x or ::1
// This host's name resolved to a non-loopback IPv4 address; UsageError (naming
// ClusterOptions::driver_addr) when it resolves only to loopback.
std::string host_name_address();
// The local address the kernel uses to reach `host` ("" when it cannot say), and whether
// `host` itself is a loopback address.
struct Route {
  std::string local;
  bool target_loopback = false;
  bool resolved = false;
};
Route route_to(const std::string& host);

// ---- ClusterOptions: an engine's struct field and its older flat field ----
// The one that was given (differs from `def`); both given and different is a UsageError.
template <class T>
T either(const T& nested, const T& flat, const T& def, const char* nested_name,
         const char* flat_name) {
  if (flat == def || flat == nested) return nested;
  if (nested == def) return flat;
  throw UsageError(std::string("ClusterOptions::") + nested_name + " and ClusterOptions::" +
                   flat_name + " are both set, to different values; they are the same setting (" +
                   flat_name + " is its older name): set one of them");
}

}  // namespace dtrain::engines
