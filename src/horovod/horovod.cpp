// hvd's API functions: the process-wide context, requests and handles.
#include "dtrain/horovod.h"

#include <unistd.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

#include "comm/backend.h"
#include "comm/c10d_compat.h"
#include "core/hostfile.h"
#include "core/params.h"
#include "dtrain/collectives.h"
#include "dtrain/engine_env.h"
#include "dtrain/env.h"
#include "dtrain/process_group.h"
#include "horovod/controller.h"

namespace dtrain::hvd {

namespace {

using detail::Controller;
using detail::Kind;
using detail::Pending;
using detail::Request;

struct Context {
  InitOptions options;
  std::shared_ptr<ProcessGroup> group;
  std::unique_ptr<Controller> controller;
  int local_rank = 0, local_size = 1, cross_rank = 0, cross_size = 1;
  Mutex handles_mu;
  std::map<Handle, std::pair<std::string, std::shared_ptr<Pending>>> handles
      DTRAIN_GUARDED_BY(handles_mu);
  Handle next_handle DTRAIN_GUARDED_BY(handles_mu) = 0;
  std::atomic<int64_t> noname[10] = {};  // per Kind (0-6), grouped (8), objects (9): unnamed so far
};

Mutex g_mu;
std::shared_ptr<Context> g_ctx DTRAIN_GUARDED_BY(g_mu);
int g_generation DTRAIN_GUARDED_BY(g_mu) = 0;  // inits so far (every rank counts alike)
bool g_atexit DTRAIN_GUARDED_BY(g_mu) = false;

std::shared_ptr<Context> ctx(const char* what) {
  MutexLock lock(g_mu);
  if (!g_ctx) {
    throw UsageError(std::string("hvd::") + what +
                     ": hvd is not initialized; call dtrain::hvd::init() first");
  }
  return g_ctx;
}

// hvd's own group over the job's store: the default group's backend choice, its own
// connections and shared-memory segment, so its background thread never interleaves with
// collectives the program issues on the default group.
// hvd's group when no launcher started this process: one rank over an in-memory store, as
// Horovod's hvd.init() without horovodrun runs ("no rendezvous server provided, assuming
// single process execution": size 1, rank 0).
std::shared_ptr<ProcessGroup> single_process_group(const InitOptions& o) {
  comm::GroupRequest request;
  request.store = c10::make_intrusive<c10d::HashStore>();
  request.rank = 0;
  request.world = 1;
  request.timeout = o.timeout;
  auto backends = std::make_shared<comm::GroupBackends>(comm::make_group_backends(request));
  return std::make_shared<ProcessGroup>(request.store, std::move(backends));
}

std::shared_ptr<ProcessGroup> make_group(const InitOptions& o, int generation) {
  std::shared_ptr<ProcessGroup> base;
  try {
    base = default_group();
  } catch (const UsageError&) {
    // No launcher's variables at all (a HOROVOD_SIZE without them still gets the error).
    if (!WorkerEnv::from_environ() && !engine_worker_env() && !param::kHorovodRank.get_if_set() &&
        !param::kHorovodSize.get_if_set())
      return single_process_group(o);
    ProcessGroupOptions po;
    po.timeout = o.timeout;
    base = init_process_group(po);
  }
  auto store = c10::make_intrusive<c10d::PrefixStore>("horovod/" + std::to_string(generation),
                                                      base->store());
  const int rank = base->rank(), world = base->world_size();
  // The same backends the default group chose (its description is a valid spec).
  comm::GroupRequest request;
  request.spec = base->backend_name();
  request.store = store;
  request.rank = rank;
  request.world = world;
  request.timeout = o.timeout;
  request.cuda_device = base->cuda_device();
  auto backends = std::make_shared<comm::GroupBackends>(comm::make_group_backends(request));
  return std::make_shared<ProcessGroup>(store, std::move(backends));
}

void shutdown_at_exit() {
  try {
    shutdown();
  } catch (...) {
    // Exiting anyway: nothing useful to do with an error here.
  }
}

std::string auto_name(Context& c, Kind kind, const std::string& given) {
  if (!given.empty()) return given;
  return std::string(detail::kind_name(kind)) + ".noname." +
         std::to_string(c.noname[static_cast<int>(kind)].fetch_add(1));
}

// A tensor hvd's group can move: defined, and on a device type the group has a backend for
// (CPU always; CUDA where init_process_group found GPUs - see dtrain/process_group.h).
void check_tensor(const torch::Tensor& t, const char* what, const ProcessGroup& group) {
  if (!t.defined()) throw UsageError(std::string("hvd::") + what + ": the tensor is undefined");
  if (group.backend_name(t.device().type()).empty()) {
    throw UsageError(std::string("hvd::") + what + ": the tensor is on " + t.device().str() +
                     ", but hvd's group (backend '" + group.backend_name() +
                     "') takes no tensors there; move it with .cpu(), or run a CUDA build of "
                     "dtrain where every rank sees a GPU");
  }
}

void check_reduce(const torch::Tensor& t, const AllreduceOptions& o, const char* what,
                  const ProcessGroup& group) {
  const int size = group.world_size();
  check_tensor(t, what, group);
  if (o.op == ReduceOp::Adasum) {
    if (size & (size - 1)) {
      throw UsageError(std::string("hvd::") + what +
                       ": op Adasum runs on a power-of-2 number of ranks only, as " +
                       "Horovod's ('Running Adasum with non-power of 2 ranks is not supported "
                       "yet'); this job has " +
                       std::to_string(size) +
                       " ranks: run 2, 4, 8, ... processes, or use hvd::Average");
    }
    if (!at::isFloatingType(t.scalar_type())) {
      throw UsageError(std::string("hvd::") + what + ": op Adasum on a " +
                       std::string(c10::toString(t.scalar_type())) +
                       " tensor; Adasum combines floating-point tensors");
    }
  }
  if (!at::isFloatingType(t.scalar_type())) {
    if (o.op == ReduceOp::Average) {
      throw UsageError(std::string("hvd::") + what + ": op Average on a " +
                       std::string(c10::toString(t.scalar_type())) +
                       " tensor; average floating-point tensors, or use hvd::Sum for integers");
    }
    if (o.prescale_factor != 1.0 || o.postscale_factor != 1.0) {
      throw UsageError(std::string("hvd::") + what +
                       ": prescale/postscale factors need a floating-point tensor, got " +
                       std::string(c10::toString(t.scalar_type())));
    }
  }
}

Handle enqueue(Context& c, Request r) {
  auto pending = std::make_shared<Pending>();
  r.pending = pending;
  const std::string label = std::string(detail::kind_name(r.kind)) + " '" + r.name + "'";
  Handle h;
  {
    MutexLock lock(c.handles_mu);
    h = c.next_handle++;
    c.handles[h] = {label, pending};
  }
  try {
    c.controller->submit(std::move(r));
  } catch (...) {
    MutexLock lock(c.handles_mu);
    c.handles.erase(h);
    throw;
  }
  return h;
}

std::shared_ptr<Pending> wait_handle(Handle handle, std::string* label = nullptr) {
  auto c = ctx("synchronize");
  std::pair<std::string, std::shared_ptr<Pending>> entry;
  {
    MutexLock lock(c->handles_mu);
    auto it = c->handles.find(handle);
    if (it == c->handles.end()) {
      throw UsageError("hvd::synchronize: unknown handle " + std::to_string(handle) +
                       " (already synchronized, or not returned by an hvd *_async call)");
    }
    entry = it->second;
  }
  auto& p = *entry.second;
  // While we wait, hvd's background thread starts its cycles at once (see controller.h).
  struct Waiting {
    Controller* c;
    explicit Waiting(Controller* ctl) : c(ctl) { c->add_waiter(1); }
    ~Waiting() { c->add_waiter(-1); }
  };
  std::optional<Waiting> waiting;
  if (c->controller) waiting.emplace(c->controller.get());
  if (c->controller)
    c->controller->wait(p, c->options.timeout);  // runs due cycles itself, see controller.h
  MutexLock lock(p.mu);
  if (!p.cv.wait_for(lock.native(),
                     c->controller ? std::chrono::milliseconds(0) : c->options.timeout, [&] {
                       p.mu.assert_held();
                       return p.done;
                     })) {
    throw TimeoutError("hvd::synchronize: " + entry.first + " did not finish within " +
                       std::to_string(c->options.timeout.count()) +
                       " ms; some rank has not submitted it (see hvd's stall warnings on rank 0)");
  }
  lock.unlock();
  {
    MutexLock hl(c->handles_mu);
    c->handles.erase(handle);
  }
  if (label) *label = entry.first;
  if (p.error) std::rethrow_exception(p.error);
  return entry.second;
}

}  // namespace

// ---- basics ----------------------------------------------------------------------------

void init(const InitOptions& options) {
  MutexLock lock(g_mu);
  if (g_ctx) return;
  auto c = std::make_shared<Context>();
  c->options = options;
  auto controller_options = detail::ControllerOptions::from_env();
  controller_options.timeout = options.timeout;
  c->group = make_group(options, g_generation++);
  // Where each rank runs: the launcher's variables (horovodrun's, else torchrun's), else
  // worked out from every rank's host name.
  // Horovod's variables, else torchrun's; -1 when neither is set.
  auto either = [](const param::Int& horovod, const char* torchrun) {
    return static_cast<int>(horovod.get_if_set().value_or(param::Int{torchrun, -1, 0}.get()));
  };
  c->local_rank = either(param::kHorovodLocalRank, "LOCAL_RANK");
  c->local_size = either(param::kHorovodLocalSize, "LOCAL_WORLD_SIZE");
  c->cross_rank = either(param::kHorovodCrossRank, "GROUP_RANK");
  c->cross_size = either(param::kHorovodCrossSize, "GROUP_WORLD_SIZE");
  if (c->local_rank < 0 || c->local_size < 1 || c->cross_rank < 0 || c->cross_size < 1) {
    const std::string host = this_host_name();
    CollectiveOptions co;
    co.group = c->group;
    auto hosts = all_gather_object(host, co);
    std::vector<std::string> distinct;
    c->local_rank = 0;
    c->local_size = 0;
    for (size_t r = 0; r < hosts.size(); ++r) {
      if (std::find(distinct.begin(), distinct.end(), hosts[r]) == distinct.end())
        distinct.push_back(hosts[r]);
      if (hosts[r] == host) {
        ++c->local_size;
        if (static_cast<int>(r) < c->group->rank()) ++c->local_rank;
      }
    }
    c->cross_size = static_cast<int>(distinct.size());
    c->cross_rank =
        static_cast<int>(std::find(distinct.begin(), distinct.end(), host) - distinct.begin());
  }
  c->controller = std::make_unique<Controller>(c->group, controller_options);
  g_ctx = c;
  if (!g_atexit) {
    g_atexit = true;
    std::atexit(shutdown_at_exit);
  }
}

void shutdown() {
  std::shared_ptr<Context> c;
  {
    MutexLock lock(g_mu);
    c.swap(g_ctx);
  }
  if (!c) return;
  c->controller->shutdown();
  // The controller itself goes with the context, once no thread waits on a handle (waiters
  // hold the context and tell the controller when they stop waiting).
}

bool is_initialized() {
  MutexLock lock(g_mu);
  return g_ctx != nullptr;
}
int size() { return ctx("size")->group->world_size(); }
int rank() { return ctx("rank")->group->rank(); }
int local_size() { return ctx("local_size")->local_size; }
int local_rank() { return ctx("local_rank")->local_rank; }
int cross_size() { return ctx("cross_size")->cross_size; }
int cross_rank() { return ctx("cross_rank")->cross_rank; }

// ---- collectives ----------------------------------------------------------------------

Handle allreduce_async(const torch::Tensor& tensor, const AllreduceOptions& options) {
  auto c = ctx("allreduce");
  check_reduce(tensor, options, "allreduce", *c->group);
  Request r;
  r.kind = Kind::kAllreduce;
  r.name = auto_name(*c, Kind::kAllreduce, options.name);
  r.tensor = tensor.detach();
  r.reduce = options;
  return enqueue(*c, std::move(r));
}

Handle allreduce_async_(torch::Tensor& tensor, const AllreduceOptions& options) {
  auto c = ctx("allreduce_");
  check_reduce(tensor, options, "allreduce_", *c->group);
  Request r;
  r.kind = Kind::kAllreduce;
  r.name = auto_name(*c, Kind::kAllreduce, options.name);
  r.tensor = tensor.detach();  // shares the storage: the result lands in `tensor`
  r.in_place = true;
  r.reduce = options;
  return enqueue(*c, std::move(r));
}

torch::Tensor allreduce(const torch::Tensor& tensor, const AllreduceOptions& options) {
  return synchronize(allreduce_async(tensor, options));
}

torch::Tensor allreduce_(torch::Tensor& tensor, const AllreduceOptions& options) {
  synchronize(allreduce_async_(tensor, options));
  return tensor;
}

std::vector<torch::Tensor> grouped_allreduce(const std::vector<torch::Tensor>& tensors,
                                             const AllreduceOptions& options) {
  auto c = ctx("grouped_allreduce");
  const std::string base =
      options.name.empty() ? "grouped_allreduce.noname." + std::to_string(c->noname[8].fetch_add(1))
                           : options.name;
  std::vector<Handle> handles;
  for (size_t i = 0; i < tensors.size(); ++i) {
    AllreduceOptions o = options;
    o.name = base + "." + std::to_string(i);
    handles.push_back(allreduce_async(tensors[i], o));
  }
  std::vector<torch::Tensor> out;
  for (auto h : handles) out.push_back(synchronize(h));
  return out;
}

Handle allgather_async(const torch::Tensor& tensor, const std::string& name) {
  auto c = ctx("allgather");
  check_tensor(tensor, "allgather", *c->group);
  if (tensor.dim() == 0)
    throw UsageError("hvd::allgather: the tensor is a scalar; give it at least one dimension");
  Request r;
  r.kind = Kind::kAllgather;
  r.name = auto_name(*c, Kind::kAllgather, name);
  r.tensor = tensor.detach().contiguous();
  return enqueue(*c, std::move(r));
}

torch::Tensor allgather(const torch::Tensor& tensor, const std::string& name) {
  return synchronize(allgather_async(tensor, name));
}

Handle broadcast_async_(torch::Tensor& tensor, int root_rank, const std::string& name) {
  auto c = ctx("broadcast");
  check_tensor(tensor, "broadcast", *c->group);
  if (root_rank < 0 || root_rank >= c->group->world_size()) {
    throw UsageError("hvd::broadcast: root_rank " + std::to_string(root_rank) +
                     " is not a rank of this job (size " + std::to_string(c->group->world_size()) +
                     ")");
  }
  Request r;
  r.kind = Kind::kBroadcast;
  r.name = auto_name(*c, Kind::kBroadcast, name);
  r.tensor = tensor.detach();
  r.in_place = true;
  r.root = root_rank;
  return enqueue(*c, std::move(r));
}

torch::Tensor broadcast_(torch::Tensor& tensor, int root_rank, const std::string& name) {
  synchronize(broadcast_async_(tensor, root_rank, name));
  return tensor;
}

torch::Tensor broadcast(const torch::Tensor& tensor, int root_rank, const std::string& name) {
  torch::Tensor copy = tensor.detach().clone();
  return broadcast_(copy, root_rank, name);
}

AlltoallResult alltoall(const torch::Tensor& tensor, const torch::Tensor& splits,
                        const std::string& name) {
  auto c = ctx("alltoall");
  check_tensor(tensor, "alltoall", *c->group);
  const int n = c->group->world_size();
  if (tensor.dim() == 0)
    throw UsageError("hvd::alltoall: the tensor is a scalar; give it at least one dimension");
  Request r;
  r.kind = Kind::kAlltoall;
  r.name = auto_name(*c, Kind::kAlltoall, name);
  r.tensor = tensor.detach().contiguous();
  if (!splits.defined()) {
    if (tensor.size(0) % n != 0) {
      throw UsageError("hvd::alltoall: dimension 0 (" + std::to_string(tensor.size(0)) +
                       ") does not divide evenly by size " + std::to_string(n) + "; pass splits");
    }
    r.splits.assign(static_cast<size_t>(n), tensor.size(0) / n);
  } else {
    auto s = splits.to(torch::kInt64).contiguous();
    if (s.dim() != 1 || s.size(0) != n) {
      throw UsageError("hvd::alltoall: splits must hold one count per rank (" + std::to_string(n) +
                       "), got shape " + c10::str(s.sizes()));
    }
    r.splits.assign(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + n);
    int64_t total = 0;
    for (auto v : r.splits) {
      if (v < 0)
        throw UsageError("hvd::alltoall: splits holds a negative count " + std::to_string(v));
      total += v;
    }
    if (total != tensor.size(0)) {
      throw UsageError("hvd::alltoall: splits sum to " + std::to_string(total) +
                       " but the tensor has " + std::to_string(tensor.size(0)) + " rows");
    }
  }
  Handle h = enqueue(*c, std::move(r));
  auto p = wait_handle(h);
  return {p->result, p->extra};
}

torch::Tensor reducescatter(const torch::Tensor& tensor, ReduceOp op, const std::string& name) {
  auto c = ctx("reducescatter");
  AllreduceOptions o;
  o.op = op;
  check_reduce(tensor, o, "reducescatter", *c->group);
  if (op != ReduceOp::Average && op != ReduceOp::Sum) {
    throw UsageError("hvd::reducescatter: op must be hvd::Average or hvd::Sum");
  }
  if (tensor.dim() == 0)
    throw UsageError("hvd::reducescatter: the tensor is a scalar; give it at least one dimension");
  Request r;
  r.kind = Kind::kReducescatter;
  r.name = auto_name(*c, Kind::kReducescatter, name);
  r.tensor = tensor.detach();
  r.reduce = o;
  return synchronize(enqueue(*c, std::move(r)));
}

int join() {
  auto c = ctx("join");
  Request r;
  r.kind = Kind::kJoin;
  r.name = "join";
  Handle h = enqueue(*c, std::move(r));
  return wait_handle(h)->join_last_rank;
}

void barrier() {
  auto c = ctx("barrier");
  Request r;
  r.kind = Kind::kBarrier;
  r.name = auto_name(*c, Kind::kBarrier, "");
  synchronize(enqueue(*c, std::move(r)));
}

torch::Tensor synchronize(Handle handle) { return wait_handle(handle)->result; }

bool poll(Handle handle) {
  auto c = ctx("poll");
  std::shared_ptr<Pending> p;
  {
    MutexLock lock(c->handles_mu);
    auto it = c->handles.find(handle);
    if (it == c->handles.end())
      throw UsageError("hvd::poll: unknown handle " + std::to_string(handle));
    p = it->second.second;
  }
  MutexLock lock(p->mu);
  return p->done;
}

// ---- model state ---------------------------------------------------------------------

void broadcast_parameters(const std::vector<std::pair<std::string, torch::Tensor>>& params,
                          int root_rank) {
  std::vector<Handle> handles;
  for (const auto& [name, t] : params) {
    torch::Tensor view = t.detach();
    handles.push_back(broadcast_async_(view, root_rank, "broadcast_parameters." + name));
  }
  for (auto h : handles) synchronize(h);
}

void broadcast_parameters(const torch::OrderedDict<std::string, torch::Tensor>& params,
                          int root_rank) {
  std::vector<std::pair<std::string, torch::Tensor>> v;
  for (const auto& item : params) v.emplace_back(item.key(), item.value());
  broadcast_parameters(v, root_rank);
}

namespace detail {

std::string broadcast_bytes(const std::string& bytes, int root_rank, const std::string& name) {
  auto c = ctx("broadcast_object");
  const std::string base =
      name.empty() ? "broadcast_object.noname." + std::to_string(c->noname[9].fetch_add(1)) : name;
  torch::Tensor len = torch::tensor(static_cast<int64_t>(bytes.size()), torch::kInt64).reshape({1});
  broadcast_(len, root_rank, base + ".size");
  torch::Tensor data = torch::zeros({len.item<int64_t>()}, torch::kUInt8);
  if (c->group->rank() == root_rank && !bytes.empty())
    std::memcpy(data.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  if (data.numel() > 0) broadcast_(data, root_rank, base + ".bytes");
  return std::string(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()),
                     static_cast<size_t>(data.numel()));
}

}  // namespace detail

void broadcast_optimizer_state(torch::optim::Optimizer& optimizer, int root_rank) {
  // libtorch's optimizer archive keys state by parameter position, not address, so it
  // carries across processes: the root's archive is loaded everywhere else.
  std::string bytes;
  if (rank() == root_rank) {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    bytes = out.str();
  }
  bytes = detail::broadcast_bytes(bytes, root_rank, "broadcast_optimizer_state");
  if (rank() != root_rank) {
    torch::serialize::InputArchive archive;
    std::istringstream in(bytes);
    archive.load_from(in);
    optimizer.load(archive);
  }
}

}  // namespace dtrain::hvd
