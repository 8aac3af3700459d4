// A DeepSpeed config's text read as DeepSpeed reads a config file or text (hjson).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace dtrain::zero {

// `text` as DeepSpeed 0.19.8 reads a config given as a path or text (hjson.load): JSON plus `#`
// and `//` comments, `/* */` blocks and a comma before a closing bracket; a number without a
// fractional part is an integer however it is written (hjson reads 1e3 and 100.0 as the ints
// 1000 and 100); a key given twice in one object is refused, as DeepSpeed refuses it. Other hjson
// syntax (quoteless strings, omitted commas) is not read. Throws ConfigError naming `what` and
// the place; a config given as a JSON object (DeepSpeed's dict) does not come through here.
nlohmann::json read_config_text(const std::string& text, const std::string& what);

}  // namespace dtrain::zero
