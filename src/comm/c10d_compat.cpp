#include "comm/c10d_compat.h"

// c10d declares ProcessGroupGloo only under USE_C10D_GLOO (CMake defines it for this target).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <gloo/common/error.h>

#include <cstdlib>
#include <mutex>

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

c10::intrusive_ptr<c10d::ProcessGroup> as_group(const c10::intrusive_ptr<Backend>& backend,
                                                const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int world, bool is_gloo) {
#if DTRAIN_C10D_HAS_BACKEND
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  const auto type =
      is_gloo ? c10d::ProcessGroup::BackendType::GLOO : c10d::ProcessGroup::BackendType::CUSTOM;
  pg->setBackend(c10::DeviceType::CPU, type, backend);
  pg->setDefaultBackend(type);
  return pg;
#else
  (void)store, (void)rank, (void)world, (void)is_gloo;
  return backend;
#endif
}

Backend* cpu_backend(c10d::ProcessGroup& pg) {
#if DTRAIN_C10D_HAS_BACKEND
  if (!pg.hasBackends()) return nullptr;
  try {
    return pg.getBackend(c10::DeviceType::CPU).get();
  } catch (const c10::Error&) {
    return nullptr;
  }
#else
  return &pg;
#endif
}

c10::intrusive_ptr<c10d::Work> barrier(c10d::ProcessGroup& pg,
                                       const c10d::BarrierOptions& options) {
  if (Backend* backend = cpu_backend(pg)) return backend->barrier(options);  // 1.13: pg itself
  static std::mutex front_mutex;  // see the header: the front's static tensor
  std::lock_guard<std::mutex> lock(front_mutex);
  return pg.barrier(options);
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

std::string libtorch_version() { return TORCH_VERSION; }

}  // namespace dtrain::comm
