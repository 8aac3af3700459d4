#include "comm/backend.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <sstream>

#include "comm/cuda/device.h"
#include "comm/gloo/gloo.h"
#include "comm/lazy/lazy_cuda.h"
#include "comm/shm/shm_group.h"
#include "comm/staged/staged_backend.h"
#include "dtrain/error.h"
#if DTRAIN_WITH_CUDA
#include "comm/nccl/nccl.h"
#endif

namespace dtrain::comm {

namespace {

using c10::DeviceType;

// What Gloo reduces (1.13's set; the collectives' front end held it before the traits did).
const std::vector<at::ScalarType> kGlooDtypes = {at::kFloat, at::kDouble, at::kHalf, at::kChar,
                                                 at::kByte,  at::kInt,    at::kLong};
const std::vector<at::ScalarType> kNcclDtypes = {at::kFloat,    at::kDouble, at::kHalf,
                                                 at::kBFloat16, at::kChar,   at::kByte,
                                                 at::kInt,      at::kLong,   at::kBool};

BackendTraits traits_of(const std::string& name, DeviceType device) {
  BackendTraits t;
  t.name = name;
  if (name == "gloo") {
    t.dtypes = kGlooDtypes;
    if (device == DeviceType::CPU) {
      t.ops = kOpAll;
    } else {
      // Gloo's own CUDA path (c10d stages through host memory itself).
      t.ops = kOpAllreduce | kOpBroadcast | kOpAllgather | kOpAlltoall | kOpBarrier;
      t.cuda_path = "gloo";
    }
  } else if (name == "shm") {
    // Every operation: what the shared-memory transport does not do itself goes to the Gloo
    // group it wraps; CUDA tensors are staged through pinned host buffers first.
    t.dtypes = kGlooDtypes;
    t.ops = kOpAll;
    t.native_avg = true;
    if (device == DeviceType::CUDA) t.cuda_path = "host staging";
  } else if (name == "nccl") {
    t.dtypes = kNcclDtypes;
    t.ops = kOpAll;
    t.native_avg = true;
    t.cuda_path = "nccl";
  }
  return t;
}

bool valid_for(const std::string& name, DeviceType device) {
  if (device == DeviceType::CPU) return name == "auto" || name == "gloo" || name == "shm";
  return name == "auto" || name == "gloo" || name == "shm" || name == "nccl";
}

const char* device_word(DeviceType d) { return d == DeviceType::CPU ? "cpu" : "cuda"; }

std::string spec_help() {
  return "use \"auto\" (the default), \"shm\", \"gloo\", \"nccl\", or one backend per device as "
         "PyTorch writes it, e.g. \"cpu:gloo,cuda:nccl\"";
}

// The backend asked for per device type ("auto" included); an absent device gets none.
std::map<DeviceType, std::string> parse_spec(const std::string& spec) {
  std::map<DeviceType, std::string> out;
  if (spec == "auto" || spec == "gloo" || spec == "shm") {
    out[DeviceType::CPU] = spec;
    out[DeviceType::CUDA] = spec;
    return out;
  }
  if (spec == "nccl") {
    out[DeviceType::CPU] = "auto";
    out[DeviceType::CUDA] = "nccl";
    return out;
  }
  if (spec.find(':') == std::string::npos) {
    throw UsageError("init_process_group: unknown backend '" + spec + "'; " + spec_help());
  }
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    auto colon = item.find(':');
    std::string dev = colon == std::string::npos ? "" : item.substr(0, colon);
    std::string name = colon == std::string::npos ? "" : item.substr(colon + 1);
    DeviceType d;
    if (dev == "cpu") {
      d = DeviceType::CPU;
    } else if (dev == "cuda") {
      d = DeviceType::CUDA;
    } else {
      throw UsageError("init_process_group: backend '" + spec + "': '" + item +
                       "' does not name a device type (cpu or cuda); " + spec_help());
    }
    if (!valid_for(name, d)) {
      throw UsageError("init_process_group: backend '" + spec + "': '" + name + "' cannot run " +
                       dev + " tensors" +
                       (name == "nccl" ? " (NCCL takes CUDA tensors only)" : "") + "; " +
                       spec_help());
    }
    if (out.count(d)) {
      throw UsageError("init_process_group: backend '" + spec + "' names " + dev + " twice; " +
                       spec_help());
    }
    out[d] = name;
  }
  return out;
}

std::string nccl_unavailable(const std::string& why) {
  return "init_process_group: backend 'nccl' is not available: " + why +
         ". For CPU tensors use \"auto\", \"shm\" or \"gloo\"";
}

// Every rank's GPU (its UUID, or "none" when it sees no GPU or the group asks for no CUDA
// backend), exchanged through the store so every rank decides alike.
std::vector<std::string> exchange_gpus(const GroupRequest& r, const std::string& mine) {
  const int64_t joined = r.store->add("dtrain_backend/joined", 1);
  const std::string base = "dtrain_backend/" + std::to_string((joined - 1) / r.world) + "/gpu/";
  auto bytes = std::vector<uint8_t>(mine.begin(), mine.end());
  r.store->set(base + std::to_string(r.rank), bytes);
  std::vector<std::string> keys;
  for (int i = 0; i < r.world; ++i) keys.push_back(base + std::to_string(i));
  try {
    r.store->wait(keys, r.timeout);
  } catch (const c10::Error& e) {
    throw TimeoutError("init_process_group: rank " + std::to_string(r.rank) + " timed out after " +
                       std::to_string(r.timeout.count()) +
                       " ms waiting for every rank's GPU; a rank did not start or did not call "
                       "init_process_group [" +
                       e.what_without_backtrace() + "]");
  }
  std::vector<std::string> all;
  for (const auto& k : keys) {
    auto v = r.store->get(k);
    all.emplace_back(v.begin(), v.end());
  }
  return all;
}

// "" when every rank has a GPU of its own; else why not.
std::string shared_gpu_reason(const std::vector<std::string>& gpus) {
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i] == "none") return "rank " + std::to_string(i) + " sees no GPU";
    for (size_t j = 0; j < i; ++j) {
      if (gpus[i] == gpus[j]) {
        return "ranks " + std::to_string(j) + " and " + std::to_string(i) + " share GPU " +
               gpus[i] + " (NCCL needs a GPU of its own per rank)";
      }
    }
  }
  return "";
}

}  // namespace

bool BackendTraits::supports(at::ScalarType t) const {
  return std::find(dtypes.begin(), dtypes.end(), t) != dtypes.end();
}

std::string BackendTraits::dtype_list() const {
  std::string out;
  for (auto t : dtypes) {
    if (!out.empty()) out += ", ";
    out += c10::toString(t);
  }
  return out;
}

const DeviceBackend* GroupBackends::find(c10::DeviceType device) const {
  for (const auto& d : devices) {
    if (d.device == device) return &d;
  }
  if (device == DeviceType::CUDA && lazy_cuda) return lazy_cuda->get();
  return nullptr;
}

at::Tensor empty_for_collectives(const GroupBackends& group, at::IntArrayRef sizes,
                                 at::ScalarType dtype) {
  if (const DeviceBackend* cpu = group.find(DeviceType::CPU)) {
    if (auto* shm = dynamic_cast<shm::ShmProcessGroup*>(cpu->backend.get())) {
      if (at::Tensor t = shm->empty_pooled(sizes, dtype); t.defined()) return t;
    }
  }
  return at::empty(sizes, at::TensorOptions().dtype(dtype));
}

std::string GroupBackends::name_for(c10::DeviceType device) const {
  for (const auto& d : devices) {
    if (d.device == device) return d.traits.name;
  }
  if (device == DeviceType::CUDA && lazy_cuda) return lazy_cuda->name();
  return "";
}

std::string describe_backends(const std::string& cpu, const std::string& cuda) {
  if (cuda.empty() || cuda == cpu) return cpu;
  if (cpu.empty()) return cuda;
  return "cpu:" + cpu + ",cuda:" + cuda;
}

std::string GroupBackends::describe() const {
  return lazy_cuda ? lazy_cuda->description() : description;
}

int GroupBackends::current_cuda_device() const {
  return lazy_cuda ? lazy_cuda->device() : cuda_device;
}

bool built_with_cuda() { return cuda::built(); }

std::optional<std::chrono::milliseconds> backend_timeout(Backend& backend) {
  Backend* b = &backend;
  if (auto* router = dynamic_cast<LazyRouter*>(b)) b = router->cpu().get();
  if (auto* staged = dynamic_cast<StagedBackend*>(b)) b = staged->inner().get();
  if (auto t = gloo_timeout(*b)) return t;
  if (auto* shm = dynamic_cast<shm::ShmProcessGroup*>(b)) return shm->timeout();
  return std::nullopt;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names{"gloo", "shm"};
  if (cuda::built()) names.push_back("nccl");
  return names;
}

std::optional<BackendTraits> backend_traits(const std::string& name, c10::DeviceType device) {
  if (name == "auto" || !valid_for(name, device)) return std::nullopt;
  if ((name == "nccl" || device == DeviceType::CUDA) && !cuda::built()) return std::nullopt;
  return traits_of(name, device);
}

namespace {

// This rank's GPU and every rank's, exchanged through the group's store.
struct GpuProbe {
  int device = -1;                // this rank's GPU, -1 when it sees none
  std::vector<std::string> gpus;  // every rank's UUID, "none" for a rank without one
  bool everyone_has_one() const {
    return std::none_of(gpus.begin(), gpus.end(), [](const std::string& g) { return g == "none"; });
  }
};

GpuProbe probe_gpus(const GroupRequest& r) {
  GpuProbe p;
  if (cuda::available()) {
    p.device = r.cuda_device >= 0 ? r.cuda_device : cuda::default_device(r.rank);
    if (p.device >= cuda::device_count()) {
      throw UsageError("init_process_group: cuda_device " + std::to_string(p.device) +
                       " does not exist: this process sees " +
                       std::to_string(cuda::device_count()) +
                       " GPU(s) (CUDA_VISIBLE_DEVICES applies)");
    }
  }
  p.gpus = exchange_gpus(r, p.device >= 0 ? cuda::device_uuid(p.device) : "none");
  return p;
}

// What "auto" runs CUDA tensors with, beside the CPU backend `cpu_name`.
std::string auto_cuda_name(const std::vector<std::string>& gpus, const std::string& cpu_name) {
  if (shared_gpu_reason(gpus).empty()) return "nccl";
  return cpu_name == "shm" ? "shm" : "gloo";
}

// The CUDA backend `name` for a group whose CPU backends are `gloo` and `shm` (either may be
// null where the name does not need it).
c10::intrusive_ptr<Backend> make_cuda_backend(const std::string& name, const GroupRequest& r,
                                              int device, const c10::intrusive_ptr<Backend>& gloo,
                                              const c10::intrusive_ptr<shm::ShmProcessGroup>& shm,
                                              BackendKind* kind) {
  if (name == "nccl") {
#if DTRAIN_WITH_CUDA
    auto cuda_store = c10::make_intrusive<c10d::PrefixStore>("cuda/", r.store);
    *kind = BackendKind::kNccl;
    return make_nccl(cuda_store, r.rank, r.world, r.timeout, device);
#else
    (void)r, (void)device;
    return {};
#endif
  }
  if (name == "shm") {
    *kind = BackendKind::kCustom;
    return c10::make_intrusive<StagedBackend>(shm);
  }
  *kind = BackendKind::kGloo;
  return gloo;
}

}  // namespace

GroupBackends make_group_backends(const GroupRequest& r) {
  DTRAIN_ASSERT(r.store, "make_group_backends needs a store");
  auto wanted = parse_spec(r.spec);
  auto want_cuda = wanted.find(DeviceType::CUDA);
  const bool explicit_nccl = want_cuda != wanted.end() && want_cuda->second == "nccl";
  const auto want_cpu = wanted.find(DeviceType::CPU);

  // Decided at the first CUDA collective rather than now (comm/lazy/lazy_cuda.h): "auto" (or
  // the CPU's own backend, "gloo"/"shm") for CUDA beside a CPU backend, in a CUDA build, when
  // some rank's machine may show a GPU. Whether one may is asked without starting CUDA and
  // exchanged (one round through the store, as deciding now takes), so every rank takes the
  // same path even where only some of them have GPUs. "nccl" is decided now: its errors belong
  // to init.
  bool lazy = false;
  if (want_cuda != wanted.end() && want_cpu != wanted.end() && cuda::built() &&
      (want_cuda->second == "auto" || want_cuda->second == want_cpu->second)) {
    const bool mine = r.may_see_gpu.value_or(cuda::may_see_gpu());
    const auto may = exchange_gpus(r, mine ? "maybe" : "none");
    lazy = std::any_of(may.begin(), may.end(), [](const std::string& g) { return g != "none"; });
    if (!lazy) wanted.erase(want_cuda);  // no rank can see a GPU: no CUDA backend
    want_cuda = wanted.find(DeviceType::CUDA);
  }

  // CUDA: only in a CUDA build, and only when every rank sees a GPU ("auto", "gloo", "shm"
  // then simply have no CUDA backend; "nccl" is an error).
  GpuProbe probe;
  if (want_cuda != wanted.end() && !lazy) {
    if (!cuda::built()) {
      if (explicit_nccl) {
        throw UsageError(nccl_unavailable("this build of dtrain has no CUDA (libtorch " +
                                          libtorch_version() +
                                          "; configure it against a CUDA libtorch, e.g. "
                                          "DTRAIN_LIBTORCH=pypi scripts/setup.sh, and check that "
                                          "its configure step says CUDA was found)"));
      }
      wanted.erase(want_cuda);
    } else {
      probe = probe_gpus(r);
      // NCCL refuses two ranks on one GPU ("Duplicate GPU detected") only at its first
      // collective; asked for by name, say so here, at init, on every rank alike.
      if (const std::string why = shared_gpu_reason(probe.gpus); explicit_nccl && !why.empty()) {
        throw UsageError(nccl_unavailable(why + " (CUDA_VISIBLE_DEVICES applies)"));
      }
      if (!probe.everyone_has_one()) {
        wanted.erase(DeviceType::CUDA);
        probe.device = -1;
      }
    }
  }

  GroupBackends out;
  out.timeout = r.timeout;
  std::vector<DeviceBinding> bindings;

  // The CPU backend (Gloo always underneath: the shared-memory backend wraps it).
  c10::intrusive_ptr<Backend> gloo;
  c10::intrusive_ptr<shm::ShmProcessGroup> shm;
  auto need_gloo = [&]() -> c10::intrusive_ptr<Backend> {
    if (!gloo) {
      Backend* like = nullptr;
      if (r.like) {
        if (const auto* cpu = r.like->find(DeviceType::CPU)) {
          like = cpu->backend.get();
          if (auto* router = dynamic_cast<LazyRouter*>(like)) like = router->cpu().get();
          if (auto* s = dynamic_cast<shm::ShmProcessGroup*>(like)) like = s->gloo().get();
          if (auto* st = dynamic_cast<StagedBackend*>(like)) {
            like = st->inner().get();
            if (auto* s = dynamic_cast<shm::ShmProcessGroup*>(like)) like = s->gloo().get();
          }
        }
      }
      gloo = like ? make_gloo_like(like, r.store, r.rank, r.world, r.timeout)
                  : make_gloo(r.store, r.rank, r.world, r.timeout, r.gloo_hostname);
    }
    return gloo;
  };
  auto need_shm = [&](bool require) -> c10::intrusive_ptr<shm::ShmProcessGroup> {
    if (!shm)
      shm = shm::ShmProcessGroup::join(r.store, r.rank, r.world, need_gloo(), r.timeout, require);
    return shm;
  };

  std::string cpu_name;
  if (auto it = wanted.find(DeviceType::CPU); it != wanted.end()) {
    cpu_name = it->second;
    if (cpu_name == "gloo") {
      need_gloo();
    } else {
      cpu_name = need_shm(/*require=*/cpu_name == "shm") ? "shm" : "gloo";
      if (cpu_name == "gloo") need_gloo();
    }
  }

  if (lazy) {
    GroupRequest later = r;
    later.like = nullptr;  // the parent's backends need not outlive this group's decision
    const std::string cuda_wanted = want_cuda->second;
    auto decide = [later, cuda_wanted, cpu_name, gloo, shm]() -> CudaDecision {
      GpuProbe p = probe_gpus(later);
      if (!p.everyone_has_one()) return {};
      const std::string name =
          cuda_wanted == "auto" ? auto_cuda_name(p.gpus, cpu_name) : cuda_wanted;
      BackendKind kind = BackendKind::kCustom;
      DeviceBackend d{DeviceType::CUDA, traits_of(name, DeviceType::CUDA),
                      make_cuda_backend(name, later, p.device, gloo, shm, &kind)};
      return {d, p.device};
    };
    out.lazy_cuda = std::make_shared<LazyCuda>(std::move(decide), cpu_name);
    c10::intrusive_ptr<Backend> cpu = cpu_name == "shm" ? c10::intrusive_ptr<Backend>(shm) : gloo;
    auto router = c10::make_intrusive<LazyRouter>(cpu, out.lazy_cuda);
    out.devices.push_back({DeviceType::CPU, traits_of(cpu_name, DeviceType::CPU), cpu});
    // libtorch 2.x keeps one backend per c10d kind: with the shared-memory backend (a custom
    // kind, as the router is) the router serves the CPU tensors too.
    if (cpu_name == "shm") {
      bindings.push_back({DeviceType::CPU, BackendKind::kCustom, router});
    } else {
      bindings.push_back({DeviceType::CPU, BackendKind::kGloo, gloo});
    }
    bindings.push_back({DeviceType::CUDA, BackendKind::kCustom, router});
    out.pg = make_process_group(r.store, r.rank, r.world, bindings, -1);
    out.description = out.lazy_cuda->description();
    return out;
  }

  std::string cuda_name;
  c10::intrusive_ptr<Backend> cuda_backend;
  BackendKind cuda_kind = BackendKind::kCustom;
  if (auto it = wanted.find(DeviceType::CUDA); it != wanted.end()) {
    cuda_name = it->second;
    if (cuda_name == "auto") cuda_name = auto_cuda_name(probe.gpus, cpu_name);
    cuda_backend =
        make_cuda_backend(cuda_name, r, probe.device, cuda_name == "gloo" ? need_gloo() : gloo,
                          cuda_name == "shm" ? need_shm(/*require=*/true) : shm, &cuda_kind);
  }

  // Bind: one object per kind (libtorch 2.x), so a staged shared-memory backend serves the
  // CPU too (it passes CPU tensors through), and Gloo serves both when both are Gloo.
  if (!cpu_name.empty()) {
    DeviceBackend d{DeviceType::CPU, traits_of(cpu_name, DeviceType::CPU), {}};
    BackendKind kind = BackendKind::kGloo;
    if (cpu_name == "shm") {
      kind = BackendKind::kCustom;
      d.backend = cuda_name == "shm" ? cuda_backend : c10::intrusive_ptr<Backend>(shm);
    } else {
      d.backend = gloo;
    }
    bindings.push_back({DeviceType::CPU, kind, d.backend});
    out.devices.push_back(d);
  }
  if (cuda_backend) {
    DeviceBackend d{DeviceType::CUDA, traits_of(cuda_name, DeviceType::CUDA), cuda_backend};
    bindings.push_back({DeviceType::CUDA, cuda_kind, cuda_backend});
    out.devices.push_back(d);
    out.cuda_device = probe.device;
  }
  if (bindings.empty()) {
    throw UsageError("init_process_group: backend '" + r.spec +
                     "' leaves no backend for any tensor (no GPU is visible for its CUDA part); " +
                     spec_help());
  }
  out.pg = make_process_group(r.store, r.rank, r.world, bindings, out.cuda_device);
  out.description = describe_backends(cpu_name, cuda_backend ? cuda_name : "");
  return out;
}

c10::intrusive_ptr<Backend> make_backend(const std::string& name,
                                         const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                         int size, std::chrono::milliseconds timeout,
                                         c10::Device device) {
  GroupRequest r;
  r.spec = std::string(device_word(device.type())) + ":" + name;
  r.store = store;
  r.rank = rank;
  r.world = size;
  r.timeout = timeout;
  r.cuda_device = device.has_index() ? device.index() : -1;
  auto made = make_group_backends(r);
  const auto* d = made.find(device.type());
  if (!d) {
    throw UsageError("make_backend: backend '" + name + "' cannot run " + device.str() +
                     " tensors here");
  }
  return d->backend;
}

}  // namespace dtrain::comm
