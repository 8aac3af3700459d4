#include "launch/worker_keys.h"

namespace dtrain::launch {

std::string agents_key_prefix() { return "/dtrain/"; }

int64_t clear_worker_keys(store::StoreClient& store) {
  const std::string keep = agents_key_prefix();
  int64_t deleted = 0;
  for (const auto& key : store.list_keys()) {
    if (key.compare(0, keep.size(), keep) == 0) continue;
    if (store.delete_key(key)) ++deleted;
  }
  return deleted;
}

}  // namespace dtrain::launch
