// What differs between the c10d of libtorch 1.13 and of libtorch 2.x, in one place.
//
// In 1.13 a backend (ProcessGroupGloo, our ShmProcessGroup) *is* a c10d::ProcessGroup whose
// virtual collectives run the work. From 2.0 on, c10d::ProcessGroup is a front that
// dispatches each collective (through the c10d:: operators) to the c10d::Backend registered
// for the tensors' device type, and the backends derive from c10d::Backend. dtrain's code
// above this header works on `comm::Backend` (the class a backend derives from) and on the
// c10d::ProcessGroup that `as_group` makes of a backend; nothing else needs to know which
// libtorch it was built against.
//
// Gloo's backend is made in comm/gloo/gloo.h, the other backends in comm/backend.h.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define DTRAIN_C10D_HAS_BACKEND 1
#else
#define DTRAIN_C10D_HAS_BACKEND 0
#endif

namespace dtrain::comm {

#if DTRAIN_C10D_HAS_BACKEND
using Backend = c10d::Backend;
#else
using Backend = c10d::ProcessGroup;
#endif

// How c10d files a backend (the key of libtorch 2.x's per-type table; one object per kind).
enum class BackendKind { kGloo, kNccl, kCustom };

// One device type's backend in a c10d group.
struct DeviceBinding {
  c10::DeviceType device;
  BackendKind kind;
  c10::intrusive_ptr<Backend> backend;
};

// The c10d group that dispatches each collective to the backend bound to its tensors' device
// type. The first binding is the default backend. libtorch 2.x keeps one backend per kind:
// two device types bound to one kind must be bound to the same object. `cuda_device` (>= 0)
// is the GPU the group is bound to (c10d's bound device id). 1.13 has one backend per group:
// exactly one binding, a CPU one, which is returned itself (UsageError otherwise).
c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int world,
    const std::vector<DeviceBinding>& bindings, int cuda_device = -1);

// The c10d group whose collectives on CPU tensors run on `backend`. `store`, `rank` and
// `world` are the backend's. 1.13: the backend itself. 2.x: a c10d::ProcessGroup with
// `backend` registered for the CPU (as GLOO when `is_gloo`, else as a custom backend).
c10::intrusive_ptr<c10d::ProcessGroup> as_group(const c10::intrusive_ptr<Backend>& backend,
                                                const c10::intrusive_ptr<c10d::Store>& store,
                                                int rank, int world, bool is_gloo);

// The backend that runs `pg`'s collectives on CPU tensors (1.13: `pg` itself); nullptr when
// it has none.
Backend* cpu_backend(c10d::ProcessGroup& pg);

// Issues c10d's barrier on `pg` and returns its Work. Safe to call from several threads at once,
// each on a group of its own (ranks as threads, or a program's own threads): libtorch 2.x's
// c10d::ProcessGroup::barrier() reassigns a function-local `static at::Tensor` that every group
// of the process shares on each call, so concurrent calls race on it (a double decrement of a
// freed TensorImpl: "malloc(): unaligned tcache chunk detected", "double free or corruption";
// issue #16). This calls the CPU backend's barrier directly, which is all that front's CPU
// dispatch does; a group without a CPU backend falls back to the front, one caller at a time.
// 1.13: `pg.barrier()` (no such static there).
c10::intrusive_ptr<c10d::Work> barrier(c10d::ProcessGroup& pg, const c10d::BarrierOptions& options);

// "1.13.1", "2.11.0", ...: the libtorch this build of dtrain was compiled against.
std::string libtorch_version();

}  // namespace dtrain::comm
