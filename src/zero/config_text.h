// A DeepSpeed config's text read as DeepSpeed reads a config file or text (hjson).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dtrain::zero {

// `text` as DeepSpeed 0.19.8 reads a config given as a path or text (hjson.load): JSON plus `#`
// and `//` comments, `/* */` blocks and a comma after a value before a closing bracket (not
// "[,]" or "{,}", which hjson refuses); a number written with a fraction or exponent is an
// integer when it is integral and below 1e10 in magnitude, as hjson's decoder makes it (1e3 and
// 100.0 are the ints 1000 and 100; 1e10 stays a float); a key given twice in one object is
// refused, as DeepSpeed refuses it. Other hjson syntax (quoteless strings, omitted commas) is
// not read. Throws ConfigError naming `what` and
// the place; a config given as a JSON object (DeepSpeed's dict) does not come through here.
nlohmann::json read_config_text(const std::string& text, const std::string& what);

}  // namespace dtrain::zero
