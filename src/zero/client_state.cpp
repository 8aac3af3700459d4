// A ZeRO checkpoint's client state (client_state.h).
#include "zero/client_state.h"

#include <optional>
#include <set>

#include "dtrain/error.h"

namespace dtrain::zero::ckpt {
namespace {

using detail::PyValue;

// A client_state value as the Python value DeepSpeed's torch.save would write.
detail::PyPtr py_from_json(const nlohmann::json& v, const std::string& key) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return detail::py_none();
    case nlohmann::json::value_t::boolean:
      return detail::py_bool(v.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return detail::py_int(v.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        throw UsageError("zero save_checkpoint: client_state '" + key +
                         "' holds an integer above 2^63 - 1; store it as a string");
      return detail::py_int(static_cast<int64_t>(v.get<uint64_t>()));
    case nlohmann::json::value_t::number_float:
      return detail::py_float(v.get<double>());
    case nlohmann::json::value_t::string:
      return detail::py_str(v.get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<detail::PyPtr> items;
      for (const auto& x : v) items.push_back(py_from_json(x, key));
      return detail::py_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto d = detail::py_dict();
      for (auto it = v.begin(); it != v.end(); ++it)
        detail::py_set(d, it.key(), py_from_json(it.value(), key));
      return d;
    }
    default:
      throw UsageError("zero save_checkpoint: client_state '" + key +
                       "' holds a binary value; store numbers, strings, lists or objects");
  }
}

// A Python value as JSON, or nullopt for what JSON cannot hold (a tensor, another object).
std::optional<nlohmann::json> json_from_py(const detail::PyValue& v) {
  using K = detail::PyValue::Kind;
  switch (v.kind) {
    case K::None:
      return nlohmann::json(nullptr);
    case K::Bool:
      return nlohmann::json(v.b);
    case K::Int:
      return nlohmann::json(v.i);
    case K::Float:
      return nlohmann::json(v.f);
    case K::Str:
      return nlohmann::json(v.s);
    case K::List:
    case K::Tuple: {
      auto out = nlohmann::json::array();
      for (const auto& x : v.items) {
        auto j = json_from_py(*x);
        if (!j) return std::nullopt;
        out.push_back(*j);
      }
      return out;
    }
    case K::Dict: {
      auto out = nlohmann::json::object();
      for (const auto& [k, x] : v.dict) {
        if (k->kind != K::Str && k->kind != K::Int) return std::nullopt;
        auto j = json_from_py(*x);
        if (!j) return std::nullopt;
        out[k->kind == K::Str ? k->s : std::to_string(k->i)] = *j;
      }
      return out;
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

bool own_key(const std::string& key) {
  static const std::set<std::string> keys = {
      "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
      "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
      "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
      "dp_world_size", "mp_world_size", "ds_config", "ds_version", "checkpoint_parallel_dimensions",
      "universal_checkpoint_info",
      // dtrain's
      "param_names", "loss_scaler", "zero_stage"};
  return keys.count(key) > 0;
}

nlohmann::json client_state_of(const detail::PyValue& model) {
  auto out = nlohmann::json::object();
  for (const auto& [k, v] : model.dict) {
    if (k->kind != detail::PyValue::Kind::Str || own_key(k->s)) continue;
    if (auto j = json_from_py(*v)) out[k->s] = *j;
  }
  return out;
}

detail::PyPtr with_client_state(detail::PyPtr model, const nlohmann::json& client_state) {
  for (auto it = client_state.begin(); it != client_state.end(); ++it)
    detail::py_set(model, it.key(), py_from_json(it.value(), it.key()));
  return model;
}

}  // namespace dtrain::zero::ckpt
