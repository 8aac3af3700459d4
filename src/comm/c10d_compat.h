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
// Only c10d_compat.cpp includes c10d's ProcessGroupGloo.hpp, which needs Gloo's headers: PyPI's
// torch wheel ships none, so a build against it takes the system's (Debian's libgloo-dev).
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <optional>
#include <string>

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

// A Gloo backend of `world` ranks over `store`. Its device: `hostname` when given (tests use
// "127.0.0.1"), else the interface in GLOO_SOCKET_IFNAME when set, else Gloo's default (this
// host's name, or loopback). Every collective and store wait times out after `timeout`.
c10::intrusive_ptr<Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                      int world, std::chrono::milliseconds timeout,
                                      const std::string& hostname = "");

// A Gloo backend on the same network device(s) as the Gloo backend `like` (a sub-group of
// `like`'s group, torch.distributed.new_group's way); Gloo's default device when `like` is
// not a Gloo backend.
c10::intrusive_ptr<Backend> make_gloo_like(Backend* like,
                                           const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int world, std::chrono::milliseconds timeout);

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

// The timeout of a Gloo backend made by make_gloo(); nullopt for any other backend.
std::optional<std::chrono::milliseconds> gloo_timeout(Backend& backend);

// Whether `e` is Gloo's "a peer's connection failed" (gloo::IoException; in 2.x also c10d's
// DistNetworkError).
bool is_gloo_io_error(const std::exception_ptr& e);

// "1.13.1", "2.11.0", ...: the libtorch this build of dtrain was compiled against.
std::string libtorch_version();

}  // namespace dtrain::comm
