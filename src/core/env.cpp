#include "dtrain/env.h"

#include <cstdlib>
#include <string_view>

#include "dtrain/error.h"

namespace dtrain {

std::map<std::string, std::string> WorkerEnv::to_variables() const {
  return {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
      {"GROUP_RANK", std::to_string(group_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(group_world_size)},
      {"ROLE_RANK", std::to_string(role_rank)},
      {"ROLE_WORLD_SIZE", std::to_string(role_world_size)},
      {"ROLE_NAME", role_name},
      {"MASTER_ADDR", master_addr},
      {"MASTER_PORT", std::to_string(master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(max_restarts)},
      {"TORCHELASTIC_RUN_ID", run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", use_agent_store ? "True" : "False"},
      {"TORCHELASTIC_ERROR_FILE", error_file},
  };
}

namespace {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int get_int(const char* name, int fallback) {
  auto v = get(name);
  if (!v) return fallback;
  try {
    size_t used = 0;
    int x = std::stoi(*v, &used);
    if (used != v->size()) throw std::invalid_argument("trailing characters");
    return x;
  } catch (const std::exception&) {
    throw UsageError(std::string("environment variable ") + name + "='" + *v +
                     "' is not an integer; the launcher (dtrain run or torchrun) sets it, "
                     "so unset it or set it to a number");
  }
}

}  // namespace

std::optional<WorkerEnv> WorkerEnv::from_environ() {
  if (!get("RANK") || !get("WORLD_SIZE")) return std::nullopt;
  WorkerEnv e;
  e.rank = get_int("RANK", 0);
  e.world_size = get_int("WORLD_SIZE", 1);
  e.local_rank = get_int("LOCAL_RANK", e.rank);
  // torchrun's names first, then those DeepSpeed's launcher (launch.py) sets instead:
  // LOCAL_SIZE, CROSS_RANK, CROSS_SIZE.
  e.local_world_size = get_int("LOCAL_WORLD_SIZE", get_int("LOCAL_SIZE", e.world_size));
  e.group_rank = get_int("GROUP_RANK", get_int("CROSS_RANK", 0));
  e.group_world_size = get_int("GROUP_WORLD_SIZE", get_int("CROSS_SIZE", 1));
  e.role_rank = get_int("ROLE_RANK", e.rank);
  e.role_world_size = get_int("ROLE_WORLD_SIZE", e.world_size);
  e.role_name = get("ROLE_NAME").value_or("default");
  e.master_addr = get("MASTER_ADDR").value_or("127.0.0.1");
  e.master_port = get_int("MASTER_PORT", 29500);
  e.restart_count = get_int("TORCHELASTIC_RESTART_COUNT", 0);
  e.max_restarts = get_int("TORCHELASTIC_MAX_RESTARTS", 0);
  e.run_id = get("TORCHELASTIC_RUN_ID").value_or("none");
  e.use_agent_store = get("TORCHELASTIC_USE_AGENT_STORE").value_or("False") == "True";
  e.error_file = get("TORCHELASTIC_ERROR_FILE").value_or("");
  if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size) {
    throw UsageError("RANK=" + std::to_string(e.rank) +
                     " and WORLD_SIZE=" + std::to_string(e.world_size) +
                     " are inconsistent: need 0 <= RANK < WORLD_SIZE");
  }
  return e;
}

std::string WorkerEnv::store_prefix() const {
  return "/worker/attempt_" + std::to_string(restart_count);
}

}  // namespace dtrain
