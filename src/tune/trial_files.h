// The files Ray Tune writes for every trial, written the way Ray 2.60 writes them, and the
// text forms they share with the search's results.csv.
//
//   params.json    the trial's config, at every start of the trial (a PBT exploit changes it):
//                  JsonLoggerCallback.update_config, json.dump(indent=2, sort_keys=True).
//   result.json    one JSON object per reported result, appended (JsonLoggerCallback), with
//                  Python's json.dumps spacing.
//   progress.csv   one row per reported result, appended (CSVLoggerCallback): the result
//                  without "config", nested objects flattened to "a/b"; the header is the
//                  first result's keys, later keys are dropped, missing ones left empty;
//                  Python's csv module's text ("True", "\r\n" line ends).
//
// Not thread-safe; the Tuner's driver thread is the only caller.
#pragma once

#include <string>
#include <vector>

#include "dtrain/tune_search_space.h"

namespace dtrain::tune::detail {

// Ray's flatten_dict(result, delimiter="/"): nested objects become "a/b" keys, placed after
// the keys that were flat (Ray removes the nested key and appends its flattened children).
Config flatten(const Config& value);

// Python's json.dumps(value): ", " and ": " separators, NaN/Infinity spelled as Python does.
std::string python_json(const Config& value);

// A value as Python's csv module writes it (str(value); None is empty), quoted when needed.
std::string csv_field(const Config& value);
std::string csv_quote(const std::string& text);

// The fields of a CSV line written by csv_quote (quotes undone).
std::vector<std::string> csv_split(const std::string& line);

// Writes trial_dir/params.json (replaces it). Error: cannot write.
void write_params(const std::string& trial_dir, const Config& config);

// Appends `result` to trial_dir/result.json and trial_dir/progress.csv. Error: cannot write.
void append_result(const std::string& trial_dir, const Config& result);

}  // namespace dtrain::tune::detail
