// DeepSpeed's data_types rules shared by the config parser (dtrain::core) and the engine.
#pragma once

#include <string>
#include <vector>

#include "dtrain/zero_config.h"

namespace dtrain::zero {

// The regular expression DeepSpeed 0.19.8 builds from data_types.keep_in_fp32_modules: each
// pattern with '*' as ".*", the distinct ones sorted and joined by '|'; a buffer is kept in
// fp32 when the expression is found anywhere in its full name.
std::string keep_in_fp32_regex(const std::vector<std::string>& patterns);

// The dtype DeepSpeed reduces gradients in, from the config's communication_data_type:
// "fp16", "bf16" or "fp32", or "" when not given (DeepSpeed's default: the model's dtype).
// parse_config refused any other value; read from Config::raw.
std::string communication_data_type(const Config& c);

}  // namespace dtrain::zero
