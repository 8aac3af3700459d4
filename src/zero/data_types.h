// DeepSpeed's data_types rules shared by the config parser (dtrain::core) and the engine.
#pragma once

#include <string>
#include <vector>

namespace dtrain::zero {

// The regular expression DeepSpeed 0.19.8 builds from data_types.keep_in_fp32_modules: each
// pattern with '*' as ".*", the distinct ones sorted and joined by '|'; a buffer is kept in
// fp32 when the expression is found anywhere in its full name.
std::string keep_in_fp32_regex(const std::vector<std::string>& patterns);

}  // namespace dtrain::zero
