// A ZeRO checkpoint's client state: the caller's keys at the top level of the model file, as
// DeepSpeed's save_checkpoint(client_state=...) writes them.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "zero/pickle.h"

namespace dtrain::zero::ckpt {

// The model file's top-level keys DeepSpeed 0.19.8 (engine._common_checkpoint_state and its
// reserved metadata) or dtrain writes itself: what is not one of these is the client's.
bool own_key(const std::string& key);

// The client's keys of a model file (DeepSpeed's client_state, less DeepSpeed's own metadata).
nlohmann::json client_state_of(const detail::PyValue& model);

// The model file with the caller's client_state added at the top level, as DeepSpeed adds it.
detail::PyPtr with_client_state(detail::PyPtr model, const nlohmann::json& client_state);

}  // namespace dtrain::zero::ckpt
