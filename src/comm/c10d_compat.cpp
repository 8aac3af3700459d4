#include "comm/c10d_compat.h"

#include <mutex>

#include "dtrain/error.h"

namespace dtrain::comm {

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
    const std::vector<DeviceBinding>& bindings, int cuda_device) {
  DTRAIN_ASSERT(!bindings.empty(), "a process group needs at least one backend");
#if DTRAIN_C10D_HAS_BACKEND
  auto type = [](BackendKind kind) {
    switch (kind) {
      case BackendKind::kGloo:
        return c10d::ProcessGroup::BackendType::GLOO;
      case BackendKind::kNccl:
        return c10d::ProcessGroup::BackendType::NCCL;
      case BackendKind::kCustom:
        break;
    }
    return c10d::ProcessGroup::BackendType::CUSTOM;
  };
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, world);
  if (cuda_device >= 0) {
    pg->setBoundDeviceId(
        c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(cuda_device)));
  }
  for (const auto& b : bindings) pg->setBackend(b.device, type(b.kind), b.backend);
  pg->setDefaultBackend(type(bindings.front().kind));
  return pg;
#else
  (void)store, (void)rank, (void)world, (void)cuda_device;
  if (bindings.size() != 1 || bindings.front().device != c10::DeviceType::CPU) {
    throw UsageError("libtorch " + libtorch_version() +
                     " has one backend per process group, for CPU tensors only; build dtrain "
                     "against libtorch 2.x for CUDA backends");
  }
  return bindings.front().backend;
#endif
}

c10::intrusive_ptr<c10d::ProcessGroup> as_group(const c10::intrusive_ptr<Backend>& backend,
                                                const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int world, bool is_gloo) {
  return make_process_group(
      store, rank, world,
      {{c10::DeviceType::CPU, is_gloo ? BackendKind::kGloo : BackendKind::kCustom, backend}});
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

std::string libtorch_version() { return TORCH_VERSION; }

}  // namespace dtrain::comm
