// The text of the search's saved state (storage_path/name/tuner_state.json): JSON as Python's
// json module writes and reads it, which is how Ray Tune 2.60 saves its experiment state
// (TuneController.save_to_dir: json.dump, allow_nan left on). A NaN or infinite metric is
// written as the bare token NaN, Infinity or -Infinity (strict JSON has none; nlohmann would
// write null) and read back as that number, so a resumed search has a diverged trial's NaN (in
// its history, best_result's scores, what the stopper is shown again) as the NaN it reported,
// not as a missing value, as Ray's Tuner.restore has it.
//
//     std::string text = dump_state_json(state);            // one-space indent, as before
//     Config again = parse_state_json(text, path.string());  // NaN stays NaN
//
// Python's json.load reads the file (NaN -> float('nan')); a strict JSON reader does not.
// Thread-safe; pure functions.
#pragma once

#include <string>

#include "dtrain/tune_search_space.h"

namespace dtrain::tune::detail {

// `value` as text (json.dump(value, indent=1) layout, keys in their order); a non-finite
// float is NaN, Infinity or -Infinity. Throws nlohmann's type_error for invalid UTF-8.
std::string dump_state_json(const Config& value);

// Reads dump_state_json's text (and any strict JSON): the tokens NaN, Infinity and -Infinity
// become those numbers. UsageError naming `where` when the text is not such JSON, or when an
// object holds a key twice (dump_state_json never writes that).
Config parse_state_json(const std::string& text, const std::string& where);

}  // namespace dtrain::tune::detail
