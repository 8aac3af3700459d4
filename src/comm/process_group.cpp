#include "dtrain/process_group.h"

#include <signal.h>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <mutex>
#include <optional>

#include "comm/backend.h"
#include "comm/c10d_compat.h"
#include "core/thread_annotations.h"
#include "diagnosis/monitor.h"
#include "dtrain/debug.h"
#include "dtrain/engine_env.h"
#include "dtrain/env.h"
#include "dtrain/error.h"
#include "store/token_store.h"

namespace dtrain {

namespace {

Mutex g_mutex;
std::shared_ptr<ProcessGroup> g_default DTRAIN_GUARDED_BY(g_mutex);

struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  int rank;
  int world_size;
};

void check_match(const char* what, int given, int from_env) {
  if (given >= 0 && given != from_env) {
    throw UsageError(std::string("init_process_group: ") + what + "=" + std::to_string(given) +
                     " but the launcher's environment says " + std::to_string(from_env) +
                     "; drop the option or fix the environment");
  }
}

Rendezvous env_rendezvous(const ProcessGroupOptions& o) {
  auto env = WorkerEnv::from_environ();
  if (!env) env = engine_worker_env();  // started by srun, mpirun or mpiexec (engine_env.h)
  if (!env) {
    throw UsageError(
        "init_process_group(env://): RANK and WORLD_SIZE are not set; start this program with "
        "`dtrain run` (or torchrun, srun, mpirun), or pass init_method tcp://HOST:PORT with rank "
        "and world_size");
  }
  check_match("rank", o.rank, env->rank);
  check_match("world_size", o.world_size, env->world_size);
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env->master_port);
  so.timeout = o.timeout;
  so.numWorkers = env->world_size;
  c10::intrusive_ptr<c10d::Store> store;
  if (env->use_agent_store) {
    // The agent hosts the store; we are clients under this attempt's prefix, exactly as
    // PyTorch's env:// handler does when TORCHELASTIC_USE_AGENT_STORE=True.
    so.isServer = false;
    so.waitWorkers = false;
    c10::intrusive_ptr<c10d::Store> tcp;
    const std::string token = store::job_store_token();
    if (!token.empty()) {
      // The agent's store admits only clients that prove the job's token; c10d's cannot.
      tcp = c10::make_intrusive<store::TokenStore>(env->master_addr, so.port, token, o.timeout);
    } else {
      tcp = c10::make_intrusive<c10d::TCPStore>(env->master_addr, so);
    }
    store = c10::make_intrusive<c10d::PrefixStore>(env->store_prefix(), tcp);
  } else {
    so.isServer = env->rank == 0;
    so.multiTenant = true;
    store = c10::make_intrusive<c10d::TCPStore>(env->master_addr, so);
  }
  return {store, env->rank, env->world_size};
}

void require_rank(const ProcessGroupOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    throw UsageError("init_process_group(" + o.init_method +
                     "): needs world_size >= 1 and 0 <= rank < world_size, got rank=" +
                     std::to_string(o.rank) + " world_size=" + std::to_string(o.world_size));
  }
}

Rendezvous url_rendezvous(const ProcessGroupOptions& o) {
  const std::string& url = o.init_method;
  if (url.rfind("env://", 0) == 0) return env_rendezvous(o);
  if (url.rfind("tcp://", 0) == 0) {
    require_rank(o);
    std::string hostport = url.substr(6);
    auto colon = hostport.rfind(':');
    int port = -1;
    if (colon != std::string::npos) {
      try {
        port = std::stoi(hostport.substr(colon + 1));
      } catch (const std::exception&) {
      }
    }
    if (colon == std::string::npos || colon == 0 || port < 1 || port > 65535) {
      throw UsageError("init_process_group: init_method '" + url +
                       "' is malformed; expected tcp://HOST:PORT with PORT in 1-65535");
    }
    c10d::TCPStoreOptions so;
    so.port = static_cast<std::uint16_t>(port);
    so.isServer = o.rank == 0;
    so.numWorkers = o.world_size;
    so.timeout = o.timeout;
    so.multiTenant = true;
    auto store = c10::make_intrusive<c10d::TCPStore>(hostport.substr(0, colon), so);
    return {store, o.rank, o.world_size};
  }
  if (url.rfind("file://", 0) == 0) {
    require_rank(o);
    std::string path = url.substr(7);
    if (path.empty()) {
      throw UsageError("init_process_group: init_method '" + url +
                       "' has no path; expected file:///PATH");
    }
    auto store = c10::make_intrusive<c10d::FileStore>(path, o.world_size);
    store->setTimeout(o.timeout);
    return {store, o.rank, o.world_size};
  }
  throw UsageError("init_process_group: init_method '" + url +
                   "' is not supported; use env://, tcp://HOST:PORT or file:///PATH");
}

}  // namespace

namespace {

// The traits of a single-backend CPU group made outside the factory (ranks as threads).
std::shared_ptr<const comm::GroupBackends> single_cpu(
    const c10::intrusive_ptr<c10d::ProcessGroup>& pg, const std::string& backend) {
  auto b = std::make_shared<comm::GroupBackends>();
  b->pg = pg;
  b->description = backend;
  comm::DeviceBackend d;
  d.device = c10::DeviceType::CPU;
  d.traits = comm::backend_traits(backend, c10::DeviceType::CPU)
                 .value_or(comm::backend_traits("gloo", c10::DeviceType::CPU).value());
  if (comm::Backend* cpu = comm::cpu_backend(*pg))
    d.backend = c10::intrusive_ptr<comm::Backend>::reclaim_copy(cpu);
  b->devices.push_back(d);
  b->timeout = std::chrono::minutes(30);
  if (d.backend) b->timeout = comm::backend_timeout(*d.backend).value_or(b->timeout);
  return b;
}

}  // namespace

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Store> store,
                           c10::intrusive_ptr<c10d::ProcessGroup> pg, std::string backend)
    : store_(std::move(store)), pg_(std::move(pg)), backends_(single_cpu(pg_, backend)) {
  monitor_ = std::make_shared<diagnosis::GroupMonitor>(store_, pg_->getRank(), pg_->getSize());
}

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Store> store,
                           std::shared_ptr<const comm::GroupBackends> backends)
    : store_(std::move(store)), pg_(backends->pg), backends_(std::move(backends)) {
  monitor_ = std::make_shared<diagnosis::GroupMonitor>(store_, pg_->getRank(), pg_->getSize());
}

ProcessGroup::~ProcessGroup() = default;

std::string ProcessGroup::backend_name() const { return backends_->describe(); }

std::string ProcessGroup::backend_name(c10::DeviceType device) const {
  return backends_->name_for(device);
}

int ProcessGroup::cuda_device() const { return backends_->current_cuda_device(); }

std::chrono::milliseconds ProcessGroup::timeout() const { return backends_->timeout; }

// Not pg_->barrier(): on libtorch 2.x that races with other threads' barriers (c10d_compat.h).
void ProcessGroup::barrier() { comm::barrier(*pg_, c10d::BarrierOptions())->wait(); }

std::shared_ptr<ProcessGroup> init_process_group(const ProcessGroupOptions& options) {
  // Bad options fail here, before this rank joins (and its peers wait for it).
  diagnosis::check_environment();
  std::optional<DebugLevel> debug;
  if (!options.debug.empty())
    debug = parse_debug_level(options.debug, "ProcessGroupOptions::debug");
  if (options.stall_timeout.count() < 0) {
    throw UsageError(
        "init_process_group: stall_timeout must be > 0 ms (0 = DTRAIN_STALL_TIMEOUT or 60 s), "
        "got " +
        std::to_string(options.stall_timeout.count()) + " ms");
  }
  if (options.cuda_device < -1) {
    throw UsageError("init_process_group: cuda_device must be >= 0 (or -1 for LOCAL_RANK's), got " +
                     std::to_string(options.cuda_device));
  }
  {
    // A malformed spec fails before the rendezvous too (the factory parses it again).
    comm::GroupRequest probe;
    probe.spec = options.backend;
    if (probe.spec.empty()) {
      throw UsageError(
          "init_process_group: backend is empty; use \"auto\" (the default), "
          "\"shm\", \"gloo\" or \"nccl\"");
    }
  }
  Rendezvous r = url_rendezvous(options);
  // A peer that dies mid-collective must surface as a NetworkError, not kill this rank:
  // libtorch 2.x's Gloo writes to sockets without MSG_NOSIGNAL on some paths, so a write to a
  // dead peer raises SIGPIPE (exit 141). Python ignores SIGPIPE; so do we, unless the program
  // installed a handler of its own.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  comm::GroupRequest request;
  request.spec = options.backend;
  request.store = r.store;
  request.rank = r.rank;
  request.world = r.world_size;
  request.timeout = options.timeout;
  request.cuda_device = options.cuda_device;
  auto backends = std::make_shared<comm::GroupBackends>(comm::make_group_backends(request));
  auto group = std::make_shared<ProcessGroup>(r.store, std::move(backends));
  if (debug) set_debug_level(*group, *debug);
  if (options.stall_timeout.count() != 0) set_stall_timeout(*group, options.stall_timeout);
  MutexLock lock(g_mutex);
  g_default = group;
  return group;
}

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        const NewGroupOptions& options) {
  auto parent = options.parent ? options.parent : default_group();
  const int world = parent->world_size();
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty())
    throw UsageError(
        "new_group: the rank list is empty; give at least one rank of the parent group");
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= world) {
      throw UsageError("new_group: rank " + std::to_string(sorted[i]) +
                       " is outside the parent group (ranks 0-" + std::to_string(world - 1) + ")");
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      throw UsageError("new_group: rank " + std::to_string(sorted[i]) + " is listed twice");
    }
  }
  // Every parent rank counts every call, members or not, so the n-th sub-group has the same
  // store prefix everywhere; members then rendezvous there as a fresh Gloo group would.
  const int id = parent->subgroups_created_++;
  auto me = std::find(sorted.begin(), sorted.end(), parent->rank());
  if (me == sorted.end()) return nullptr;
  const int rank = static_cast<int>(me - sorted.begin());
  const int size = static_cast<int>(sorted.size());
  std::chrono::milliseconds timeout = options.timeout;
  if (timeout.count() <= 0) timeout = parent->timeout();
  if (timeout.count() <= 0) timeout = std::chrono::minutes(30);
  auto store = c10::make_intrusive<c10d::PrefixStore>("dtrain_subgroup_" + std::to_string(id),
                                                      parent->store());
  // CPU: Gloo on the parent's network device; CUDA: NCCL where the parent has it, else Gloo.
  comm::GroupRequest request;
  const std::string parent_cuda = parent->backend_name(c10::DeviceType::CUDA);
  request.spec = "cpu:gloo";
  if (parent_cuda == "auto") {
    request.spec += ",cuda:auto";  // undecided in the parent: decided in the sub-group likewise
  } else if (!parent_cuda.empty()) {
    request.spec += parent_cuda == "nccl" ? ",cuda:nccl" : ",cuda:gloo";
  }
  request.store = store;
  request.rank = rank;
  request.world = size;
  request.timeout = timeout;
  request.cuda_device = parent->cuda_device();
  request.like = &parent->backends();
  auto backends = std::make_shared<comm::GroupBackends>(comm::make_group_backends(request));
  return std::make_shared<ProcessGroup>(store, std::move(backends));
}

std::shared_ptr<ProcessGroup> default_group() {
  MutexLock lock(g_mutex);
  if (!g_default) {
    throw UsageError("no process group: call dtrain::init_process_group() first");
  }
  return g_default;
}

void destroy_process_group() {
  MutexLock lock(g_mutex);
  g_default.reset();
}

}  // namespace dtrain
