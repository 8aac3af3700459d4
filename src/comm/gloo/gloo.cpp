#include "comm/gloo/gloo.h"

// c10d declares ProcessGroupGloo only under USE_C10D_GLOO (CMake defines it for this target).
#include <gloo/common/error.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

namespace dtrain::comm {

c10::intrusive_ptr<Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                      int world, std::chrono::milliseconds timeout,
                                      const std::string& hostname) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (!hostname.empty()) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(hostname));
  } else if (ifname && *ifname) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
}

c10::intrusive_ptr<Backend> make_gloo_like(Backend* like,
                                           const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int world, std::chrono::milliseconds timeout) {
  auto* gloo = dynamic_cast<c10d::ProcessGroupGloo*>(like);
  if (!gloo) return make_gloo(store, rank, world, timeout);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices = gloo->getOptions()->devices;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, options);
}

bool is_gloo(Backend& backend) {
  return dynamic_cast<c10d::ProcessGroupGloo*>(&backend) != nullptr;
}

std::optional<std::chrono::milliseconds> gloo_timeout(Backend& backend) {
  if (auto* gloo = dynamic_cast<c10d::ProcessGroupGloo*>(&backend))
    return gloo->getOptions()->timeout;
  return std::nullopt;
}

bool is_gloo_io_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const ::gloo::IoException&) {
    return true;
#if DTRAIN_C10D_HAS_BACKEND
  } catch (const c10::DistNetworkError&) {
    return true;
#endif
  } catch (...) {
    return false;
  }
}

}  // namespace dtrain::comm
