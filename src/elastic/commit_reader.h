// Reads back a commit that ElasticState wrote with the ZeRO engine (a pickled dict: format
// tag, the model's state, every rank's optimizer slice, the position metadata as JSON text,
// the CPU generator's state). The bytes come from disk or /dev/shm, where a crash, a full
// disk or another program can leave anything: every field is checked before it is used.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dtrain::elastic {

// The format tag ElasticState writes.
inline constexpr const char* kZeroCommitFormat = "dtrain.elastic.zero/1";

struct EngineCommit {
  c10::IValue model;                // a dict (the engine's model_state)
  std::vector<c10::IValue> optims;  // dicts, one per rank of the writing job
  at::Tensor rng;                   // a uint8 CPU tensor (the generator's state)
  std::map<std::string, std::string> metadata;
};

// Throws dtrain::Error naming `from` (where the bytes came from) and what is wrong.
EngineCommit read_engine_commit(const std::string& bytes, const std::string& from);

// metadata[key] as an integer. Throws dtrain::Error naming `from` and the key when it is
// missing or not a number.
std::int64_t metadata_int(const std::map<std::string, std::string>& metadata, const char* key,
                          const std::string& from);

}  // namespace dtrain::elastic
