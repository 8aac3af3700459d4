// The checkpoint files of a directory (library-internal): PREFIX<step>.pt only, so a crashed
// save's PATH.tmp.<pid> and other names never count. Shared by latest_checkpoint() and
// ElasticState's commits.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::detail {

// (step, path) of every checkpoint in `dir`, newest first (ties: the smaller name first, so
// the order is stable). A missing or unreadable directory has none.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir,
                                                              const std::string& prefix);

}  // namespace dtrain::detail
