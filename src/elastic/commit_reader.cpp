#include "elastic/commit_reader.h"

#include <torch/serialize.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "dtrain/error.h"

namespace dtrain::elastic {

namespace {

[[noreturn]] void corrupt(const std::string& from, const std::string& what) {
  throw Error("ElasticState::restore: the newest commit (" + from + ") " + what +
              "; delete it (or use another checkpoint_dir / prefix) to start over");
}

c10::IValue field(const c10::impl::GenericDict& d, const char* key, const std::string& from) {
  for (const auto& item : d) {
    if (item.key().isString() && item.key().toStringRef() == key) return item.value();
  }
  corrupt(from, std::string("has no '") + key + "'");
}

}  // namespace

EngineCommit read_engine_commit(const std::string& bytes, const std::string& from) {
  c10::IValue v;
  try {
    v = torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const std::exception& e) {
    throw Error("ElasticState::restore: the newest commit (" + from +
                ") is not a ZeRO engine commit: " + e.what());
  }
  if (!v.isGenericDict()) corrupt(from, "is not a dict");
  const auto d = v.toGenericDict();
  auto format = field(d, "format", from);
  if (!format.isString() || format.toStringRef() != kZeroCommitFormat) {
    throw Error("ElasticState::restore: the newest commit (" + from +
                ") was not written by an ElasticState with the ZeRO engine (another prefix or "
                "directory?)");
  }
  EngineCommit c;
  c.model = field(d, "model", from);
  if (!c.model.isGenericDict()) corrupt(from, "has a 'model' that is not a dict");
  auto optim = field(d, "optim", from);
  if (!optim.isList()) corrupt(from, "has an 'optim' that is not a list");
  for (const auto& o : optim.toListRef()) {
    if (!o.isGenericDict()) corrupt(from, "has an 'optim' entry that is not a dict");
    c.optims.push_back(o);
  }
  auto rng = field(d, "rng", from);
  if (!rng.isTensor() || rng.toTensor().scalar_type() != at::kByte ||
      !rng.toTensor().device().is_cpu()) {
    corrupt(from, "has an 'rng' that is not a generator state (a uint8 CPU tensor)");
  }
  c.rng = rng.toTensor();
  auto meta = field(d, "metadata", from);
  if (!meta.isString()) corrupt(from, "has a 'metadata' that is not text");
  try {
    c.metadata =
        nlohmann::json::parse(meta.toStringRef()).get<std::map<std::string, std::string>>();
  } catch (const nlohmann::json::exception& e) {
    corrupt(from,
            std::string("has a 'metadata' that is not a JSON object of strings: ") + e.what());
  }
  return c;
}

std::int64_t metadata_int(const std::map<std::string, std::string>& metadata, const char* key,
                          const std::string& from) {
  auto it = metadata.find(key);
  if (it == metadata.end()) {
    throw Error("ElasticState::restore: " + from + " has no '" + key +
                "': it is a dtrain checkpoint but not an ElasticState commit (use another prefix "
                "or directory)");
  }
  std::int64_t v = 0;
  const std::string& s = it->second;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) {
    throw Error("ElasticState::restore: " + from + " has '" + key + "' = '" + s.substr(0, 40) +
                "', not an integer; the commit is corrupt (delete it to start over)");
  }
  return v;
}

}  // namespace dtrain::elastic
