// The key a torch::optim::Optimizer files a parameter's state under: its TensorImpl pointer
// (libtorch 2.x), or that pointer printed (1.13). One helper for every optimizer of dtrain's
// that reads or fills another optimizer's state.
#pragma once

#include <torch/torch.h>

#include <sstream>
#include <string>
#include <type_traits>

namespace dtrain::optim {

template <class Map>
typename Map::key_type state_key(const Map&, const torch::Tensor& t) {
  if constexpr (std::is_same_v<typename Map::key_type, std::string>) {
    std::ostringstream s;
    s << t.unsafeGetTensorImpl();
    return s.str();
  } else {
    return t.unsafeGetTensorImpl();
  }
}

}  // namespace dtrain::optim
