// hvd's negotiation (see controller.h): the cycle, the exchange of request lines, the table
// every rank folds them into, agreement checks, stalls; the response cache, the wire format
// and execution are their own files (response_cache.cpp, wire.cpp, ops.cpp).
#include "horovod/controller.h"
#include "core/params.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "comm/backend.h"
#include "dtrain/collectives.h"
#include "dtrain/error.h"
#include "horovod/wire.h"

namespace dtrain::hvd::detail {

constexpr std::chrono::milliseconds Controller::kIdleHeartbeat;

void Pending::finish(torch::Tensor out, std::exception_ptr err) {
  {
    MutexLock lock(mu);
    if (done) return;
    result = std::move(out);
    error = std::move(err);
    done = true;
  }
  cv.notify_all();
}

ControllerOptions ControllerOptions::from_env() {
  ControllerOptions o;
  o.fusion_threshold = static_cast<int64_t>(param::kHorovodFusionThreshold.get());
  o.cycle_time =
      std::chrono::microseconds(static_cast<int64_t>(param::kHorovodCycleTime.get() * 1000));
  o.stall_check_seconds = param::kHorovodStallCheckTimeSeconds.get();
  o.stall_shutdown_seconds = param::kHorovodStallShutdownTimeSeconds.get();
  o.stall_check = !param::kHorovodStallCheckDisable.get();
  o.cache_capacity = static_cast<int64_t>(param::kHorovodCacheCapacity.get());
  o.timeline = param::kHorovodTimeline.get();
  o.timeline_mark_cycles = param::kHorovodTimelineMarkCycles.get();
  return o;
}

Controller::Controller(std::shared_ptr<ProcessGroup> group, ControllerOptions options)
    : group_(std::move(group)),
      options_(options),
      rank_(group_->rank()),
      size_(group_->world_size()),
      joined_(static_cast<size_t>(size_), false),
      shutting_down_(static_cast<size_t>(size_), false) {
  last_stall_check_ = Clock::now();
  if (rank_ == 0 && options_.stall_check && options_.stall_shutdown_seconds > 0 &&
      !shutdown_applies()) {
    std::fprintf(stderr,
                 "[hvd rank 0] WARNING: HOROVOD_STALL_SHUTDOWN_TIME_SECONDS is less than "
                 "HOROVOD_STALL_CHECK_TIME_SECONDS, will not shutdown.\n");
    std::fflush(stderr);
  }
  if (rank_ == 0 && !options_.timeline.empty()) {
    timeline_ = std::make_unique<Timeline>(options_.timeline, options_.timeline_mark_cycles);
  }
  thread_ = std::thread([this] { loop(); });
}

const std::string& Controller::activity_name(const torch::Tensor& tensor, const char* op) {
  const c10::DeviceType device = tensor.defined() ? tensor.device().type() : c10::DeviceType::CPU;
  const auto key = std::make_pair(static_cast<int>(device), std::string(op));
  if (auto it = activity_names_.find(key); it != activity_names_.end()) return it->second;
  // A CUDA backend still undecided ("auto") is decided here, a moment before the collective on
  // this tensor would decide it; every rank runs that collective, so every rank decides.
  const comm::GroupBackends& backends = group_->backends();
  backends.find(device);
  std::string transport = backends.name_for(device);
  if (transport.empty()) transport = group_->backend_name();  // the collective will say why
  for (auto& c : transport) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return activity_names_.emplace(key, transport + "_" + op).first->second;
}

Controller::~Controller() {
  {
    MutexLock lock(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  timeline_.reset();  // flushes and closes the file
}

void Controller::submit(Request request) {
  if (request.name.find_first_of("\t\n") != std::string::npos) {
    throw UsageError("hvd: the name '" + request.name +
                     "' contains a tab or newline; use another name");
  }
  MutexLock lock(mu_);
  if (!fatal_.empty()) throw Error("hvd: " + fatal_);
  if (stop_requested_ || stopped_) {
    throw UsageError("hvd: " + std::string(kind_name(request.kind)) + " '" + request.name +
                     "' after hvd::shutdown(); call hvd::init() again first");
  }
  // The background thread needs waking only when this request changes when its next cycle
  // starts: the first one queued starts the cycle-time clock, and with a caller waiting a
  // cycle starts at once. The rest of a backward pass's gradients join the queue silently
  // (a wake-up per gradient cost a context switch each on a loaded 2-core machine).
  const bool wake = queue_.empty() || waiters_ > 0;
  if (queue_.empty()) first_queued_ = Clock::now();
  queue_.push_back(std::move(request));
  lock.unlock();
  if (wake) cv_.notify_all();
}

void Controller::add_waiter(int delta) {
  // No wake-up: a waiter waits in wait(), which runs a due cycle itself when this thread is
  // not in one (a thread in a cycle reads waiters_ under mu_ before it sleeps again). Waking
  // the thread here made it race the caller for the cycle: a context switch for nothing.
  MutexLock lock(mu_);
  waiters_ += delta;
}

void Controller::shutdown() {
  {
    MutexLock lock(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  timeline_.reset();  // flushes and closes the file
}

bool Controller::cycle_due(Clock::time_point* due) {
  // When to start the next cycle (see controller.h, "When a cycle starts").
  if (stop_requested_) return true;
  if (!queue_.empty()) {
    if (waiters_ > 0) return true;  // a caller waits: nothing more is coming from it
    *due = first_queued_ + options_.cycle_time;
  } else if (bg_pending_) {
    if (waiters_ > 0 && last_progressed_) return true;
    *due = last_cycle_ + options_.cycle_time;
  } else {
    // Nothing here to negotiate: a heartbeat only (a peer's request waits for this rank's
    // own submission, which starts a cycle anyway; shutdown and stall flags ride on it).
    *due = last_cycle_ + std::max<std::chrono::microseconds>(options_.cycle_time, kIdleHeartbeat);
  }
  return Clock::now() >= *due;
}

bool Controller::run_cycle() {
  // Requests write into parameters and their gradients (leaves that
  // require grad): no autograd here (the guard is per thread, and either thread runs cycles).
  torch::NoGradGuard no_grad;
  {
    MutexLock lock(mu_);
    if (cycles_done_) return false;
    last_cycle_ = Clock::now();
  }
  bool done = false;
  try {
    negotiate_and_run();
    if (std::all_of(shutting_down_.begin(), shutting_down_.end(), [](bool b) { return b; })) {
      fail_all("hvd was shut down before this operation ran (it was not submitted by every rank)",
               false);
      done = true;
    }
    if (stall_flag_) done = true;
  } catch (const std::exception& e) {
    // A collective failed: the group is unusable (ranks no longer agree on what comes next).
    fail_all(std::string("hvd's background thread stopped: ") + e.what(), false);
    done = true;
  }
  {
    MutexLock lock(mu_);
    bg_pending_ = !mine_.empty() || !hits_.empty() || !table_.empty();
    last_progressed_ = progressed_;
    if (done) cycles_done_ = true;
  }
  // The background thread learns the end at once; otherwise it re-decides when its timer
  // fires (waking it after every cycle a caller ran would cost a context switch each).
  if (done) cv_.notify_all();
  return !done;
}

void Controller::wait(Pending& p, std::chrono::milliseconds timeout) {
  // The caller (a waiter, see add_waiter) runs the cycles itself while they are due and no
  // other thread runs one: the same cycles the background thread would run, without two
  // thread hand-offs per step. Otherwise it sleeps until its result is done or a cycle is due.
  const auto deadline = Clock::now() + timeout;
  while (true) {
    {
      MutexLock lock(p.mu);
      if (p.done) return;
    }
    if (Clock::now() >= deadline) return;
    Clock::time_point due = deadline;
    bool now = false;
    {
      MutexLock lock(mu_);
      if (!cycles_done_ && !stop_requested_ && !stopped_) now = cycle_due(&due);
    }
    if (now) {
      if (cycle_mu_.try_lock()) {
        MutexLock cycle(cycle_mu_, std::adopt_lock);
        bool still;
        {
          MutexLock lock(mu_);
          still = !cycles_done_ && !stop_requested_ && cycle_due(&due);
        }
        if (still) run_cycle();
        continue;
      }
      due = Clock::now() + std::chrono::milliseconds(1);  // another thread is in a cycle
    }
    MutexLock lock(p.mu);
    p.cv.wait_until(lock.native(), std::min(due, deadline), [&] {
      p.mu.assert_held();
      return p.done;
    });
  }
}

void Controller::loop() {
  while (true) {
    {
      MutexLock lock(mu_);
      while (!cycles_done_) {
        Clock::time_point due;
        if (cycle_due(&due)) break;
        cv_.wait_until(lock.native(), due);
      }
      if (cycles_done_) break;
    }
    MutexLock cycle(cycle_mu_);
    {
      // A waiting caller may have run the cycle meanwhile.
      MutexLock lock(mu_);
      Clock::time_point due;
      if (cycles_done_) break;
      if (!cycle_due(&due)) continue;
    }
    if (!run_cycle()) break;
  }
  MutexLock lock(mu_);
  stopped_ = true;
}

void Controller::negotiate_and_run() {
  if (timeline_) timeline_->mark_cycle_start();
  // 1. What this rank has to say: each new request is a cache hit (held under its bit) or
  // needs the full exchange.
  std::deque<Request> fresh;
  bool stopping;
  {
    MutexLock lock(mu_);
    fresh.swap(queue_);
    stopping = stop_requested_;
  }
  const bool stall_now = rank_ == 0 && !stall_flag_ && options_.stall_check && shutdown_applies() &&
                         stall_findings().shut_down;
  const bool any_joined = std::any_of(joined_.begin(), joined_.end(), [](bool b) { return b; });
  bool need_full = stopping || stall_now || any_joined || options_.cache_capacity <= 0;
  const auto now = Clock::now();
  std::vector<Request> uncached;
  for (auto& r : fresh) {
    if (mine_.count(r.name) || hit_names_.count(r.name)) {
      r.pending->finish({},
                        std::make_exception_ptr(UsageError(
                            "hvd: " + std::string(kind_name(r.kind)) + " '" + r.name +
                            "' was submitted again before the first one finished; every request in "
                            "flight needs its own name")));
      continue;
    }
    auto c = cache_.find(r.name);
    if (c != cache_.end() && !table_.count(r.name) && c->second.sig == signature(r)) {
      const int bit = c->second.bit;
      hit_names_[r.name] = bit;
      hit_since_[bit] = now;
      hits_.emplace(bit, std::move(r));
    } else {
      uncached.push_back(std::move(r));
      need_full = true;
    }
  }
  // A hit some rank has not matched for a while goes to the full exchange, where the stall
  // check sees it.
  const auto hit_limit =
      std::chrono::duration<double>(std::min(1.0, options_.stall_check_seconds / 2));
  for (const auto& [bit, since] : hit_since_) {
    if (now - since > hit_limit) need_full = true;
  }

  // 2. The cache's bit vector: requests every rank holds run now, without the full exchange.
  if (options_.cache_capacity > 0) {
    auto ready = sync_cache(need_full, !fresh.empty());
    if (!ready.empty()) {
      progressed_ = true;
      run_cached(ready);
    }
    if (!need_full) {
      idle_cycles_ =
          (!progressed_ && hits_.empty() && table_.empty() && mine_.empty()) ? idle_cycles_ + 1 : 0;
      if (rank_ == 0 && options_.stall_check) stall_check();
      if (timeline_) timeline_->flush();
      return;
    }
  }

  // 3. The full exchange: every rank announces its new requests and the hits it still holds.
  for (auto& [bit, r] : hits_) uncached.push_back(std::move(r));
  hits_.clear();
  hit_names_.clear();
  hit_since_.clear();
  std::string msg;
  if (stopping || stall_now)
    msg = std::string("F\t") + (stopping ? "1" : "0") + "\t" + (stall_now ? "1" : "0") + "\n";
  for (auto& r : uncached) {
    if (r.tensor.defined() && r.tensor.is_cuda()) last_cuda_device_ = r.tensor.device();
    msg += std::to_string(next_seq_++) + "\t" + signature(r) + "\n";
    std::string name = r.name;
    mine_.emplace(std::move(name), std::move(r));
  }

  // 2. Everyone's messages, folded into the table in rank order.
  std::vector<std::string> all = exchange(msg);
  std::vector<std::string> completed;
  bool any = false;
  if (options_.cache_capacity <= 0) progressed_ = false;
  for (int r = 0; r < size_; ++r) {
    any = any || !all[static_cast<size_t>(r)].empty();
    parse_rank_message(r, all[static_cast<size_t>(r)], completed);
  }
  // A rank joining can complete names other ranks submitted earlier.
  for (auto& [name, e] : table_) {
    if (std::find(completed.begin(), completed.end(), name) != completed.end()) continue;
    int have = e.count;
    for (int r = 0; r < size_; ++r) {
      if (e.sig[static_cast<size_t>(r)].empty() && joined_[static_cast<size_t>(r)]) ++have;
    }
    if (have == size_ && name != "join" && e.count > 0) completed.push_back(name);
  }
  idle_cycles_ = (!any && table_.empty()) ? idle_cycles_ + 1 : 0;
  if (any || !completed.empty()) progressed_ = true;

  if (stall_flag_) {
    const std::string report = stall_findings().message;
    std::fprintf(stderr,
                 "[hvd rank %d] stall shutdown (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=%g): %s\n",
                 rank_, options_.stall_shutdown_seconds, report.c_str());
    std::fflush(stderr);
    std::ostringstream why;
    why << "stall shutdown after HOROVOD_STALL_SHUTDOWN_TIME_SECONDS="
        << options_.stall_shutdown_seconds << ": " << report;
    fail_all(why.str(), true);
    return;
  }

  // 3. The ready names in the order every rank derives alike.
  if (!completed.empty()) execute(std::move(completed));
  if (rank_ == 0 && options_.stall_check) stall_check();
  if (timeline_) timeline_->flush();
}

std::vector<std::string> Controller::exchange(const std::string& msg) {
  // One all-gather of a fixed-size slot per rank (length + text) in the usual case: half the
  // collectives of all_gather_object's lengths-then-bytes, and each one wakes every rank.
  // A message too long for the slot marks its length; every rank sees that and all fall
  // back to all_gather_object together.
  constexpr int64_t kSlot = 4096;
  constexpr int64_t kText = kSlot - static_cast<int64_t>(sizeof(int64_t));
  CollectiveOptions co;
  co.group = group_;
  auto slot = torch::zeros({kSlot}, torch::kUInt8);
  const int64_t len = static_cast<int64_t>(msg.size());
  std::memcpy(slot.data_ptr<uint8_t>(), &len, sizeof len);
  if (len <= kText) std::memcpy(slot.data_ptr<uint8_t>() + sizeof len, msg.data(), msg.size());
  auto parts = dtrain::all_gather(slot, co);
  std::vector<std::string> all(parts.size());
  bool overflow = false;
  for (size_t r = 0; r < parts.size(); ++r) {
    int64_t n = 0;
    std::memcpy(&n, parts[r].data_ptr<uint8_t>(), sizeof n);
    if (n > kText) {
      overflow = true;
      continue;
    }
    all[r].assign(reinterpret_cast<const char*>(parts[r].data_ptr<uint8_t>()) + sizeof n,
                  static_cast<size_t>(n));
  }
  if (overflow) all = dtrain::all_gather_object(msg, co);
  return all;
}

void Controller::parse_rank_message(int rank, const std::string& msg,
                                    std::vector<std::string>& completed) {
  if (msg.empty()) return;
  const size_t ri = static_cast<size_t>(rank);
  std::stringstream in(msg);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == 'F') {
      auto f = split(line, '\t');
      if (f.size() >= 3) {
        if (f[1] == "1") shutting_down_[ri] = true;
        if (f[2] == "1") stall_flag_ = true;
      }
      continue;
    }
    Sig s = parse_sig(line);
    const std::string& name = s.name;
    Entry& e = table_[name];
    if (e.sig.empty()) {
      e.sig.assign(static_cast<size_t>(size_), "");
      e.seq.assign(static_cast<size_t>(size_), -1);
      e.first_seen = Clock::now();
      if (timeline_) timeline_->negotiate_start(name, kind_upper(s.kind));
    }
    if (!e.sig[ri].empty()) continue;  // a duplicate; the rank itself rejected it already
    e.sig[ri] = line;
    e.seq[ri] = s.seq;
    ++e.count;
    if (timeline_) timeline_->negotiate_rank_ready(name, rank);
    if (s.kind == Kind::kJoin) {
      joined_[ri] = true;
      last_joined_ = rank;  // ranks are folded in order, cycles in time: the last one wins
    }
    int have = e.count;
    for (int r = 0; r < size_; ++r) {
      if (e.sig[static_cast<size_t>(r)].empty() && joined_[static_cast<size_t>(r)] &&
          s.kind != Kind::kJoin)
        ++have;
    }
    if (have == size_) completed.push_back(name);
  }
}

void Controller::check_agreement(const std::string& name, const Entry& e) {
  // First submitter as the reference.
  int ref = -1;
  for (int r = 0; r < size_; ++r) {
    if (!e.sig[static_cast<size_t>(r)].empty()) {
      ref = r;
      break;
    }
  }
  Sig a = parse_sig(e.sig[static_cast<size_t>(ref)]);
  for (int r = 0; r < size_; ++r) {
    const std::string& line = e.sig[static_cast<size_t>(r)];
    if (line.empty() || r == ref) continue;
    Sig b = parse_sig(line);
    auto mismatch = [&](const std::string& what, const std::string& va, const std::string& vb) {
      throw UsageError("hvd: mismatched " + std::string(kind_name(a.kind)) + " '" + name +
                       "': rank " + std::to_string(ref) + " has " + what + " " + va +
                       " where rank " + std::to_string(r) + " has " + vb +
                       "; every rank must submit the same request under one name");
    };
    if (a.kind != b.kind) mismatch("operation", kind_name(a.kind), kind_name(b.kind));
    if (a.dtype != b.dtype) {
      mismatch("dtype", std::string(c10::toString(static_cast<c10::ScalarType>(a.dtype))),
               std::string(c10::toString(static_cast<c10::ScalarType>(b.dtype))));
    }
    if (a.device != b.device) mismatch("a tensor on", a.device, "one on " + b.device);
    const bool same_rank = a.shape.size() == b.shape.size();
    const bool tail_equal =
        same_rank && std::equal(a.shape.begin() + (a.shape.empty() ? 0 : 1), a.shape.end(),
                                b.shape.begin() + (b.shape.empty() ? 0 : 1));
    switch (a.kind) {
      case Kind::kAllreduce:
      case Kind::kReducescatter:
      case Kind::kBroadcast:
        if (a.shape != b.shape) mismatch("shape", shape_str(a.shape), shape_str(b.shape));
        if (a.kind == Kind::kBroadcast && a.root != b.root) {
          mismatch("root rank", std::to_string(a.root), std::to_string(b.root));
        }
        if (a.kind != Kind::kBroadcast &&
            (a.op != b.op || a.prescale != b.prescale || a.postscale != b.postscale ||
             a.compression != b.compression)) {
          mismatch("options (op, scale factors, compression)",
                   strip_seq(e.sig[static_cast<size_t>(ref)]), strip_seq(line));
        }
        break;
      case Kind::kAllgather:
      case Kind::kAlltoall:
        if (!tail_equal || a.shape.empty()) {
          mismatch("shape", shape_str(a.shape),
                   shape_str(b.shape) + " (all but the first dimension must match)");
        }
        break;
      default:
        break;
    }
  }
}

void Controller::fail_all(const std::string& why, bool timeout) {
  std::deque<Request> queued;
  {
    MutexLock lock(mu_);
    if (fatal_.empty()) fatal_ = why;
    queued.swap(queue_);
  }
  auto err = [&](const std::string& name) {
    return timeout ? std::make_exception_ptr(TimeoutError("hvd: '" + name + "': " + why))
                   : std::make_exception_ptr(Error("hvd: '" + name + "': " + why));
  };
  for (auto& [name, r] : mine_) {
    if (r.pending) r.pending->finish({}, err(name));
  }
  mine_.clear();
  for (auto& r : queued) {
    if (r.pending) r.pending->finish({}, err(r.name));
  }
}

Controller::StallFindings Controller::stall_findings() const {
  // Horovod's StallInspector::CheckForStalledTensors: a name some ranks submitted more than the
  // warning time ago lists every rank still missing it; a rank missing one for more than the
  // shutdown time is marked "!" and stops the job. Names per rank in sorted order, the first
  // six at most, " ..." after the sixth.
  using Seconds = std::chrono::duration<double>;
  const double warn = options_.stall_check_seconds;
  const double shut = shutdown_applies() ? options_.stall_shutdown_seconds : 0.0;
  const auto now = Clock::now();
  std::map<int, std::set<std::string>> missing;
  std::set<int> shutdown_ranks;
  for (const auto& [name, e] : table_) {
    if (e.count == 0 || e.count == size_) continue;
    const double lag = Seconds(now - e.first_seen).count();
    if (lag <= warn) continue;
    for (int r = 0; r < size_; ++r) {
      if (!e.sig[static_cast<size_t>(r)].empty() || joined_[static_cast<size_t>(r)]) continue;
      missing[r].insert(name);
      if (shut > 0 && lag > shut) shutdown_ranks.insert(r);
    }
  }
  StallFindings f;
  if (missing.empty()) return f;
  f.shut_down = !shutdown_ranks.empty();
  std::ostringstream m;
  m << "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of "
       "ranks and are waiting for remainder of ranks for more than "
    << warn
    << " seconds. This may indicate that different ranks are trying to submit different tensors "
       "or that only subset of ranks is submitting tensors, which will cause deadlock. \n"
       "Missing ranks:";
  for (const auto& [r, names] : missing) {
    m << "\n" << r << (shutdown_ranks.count(r) ? "!" : "") << ": [";
    int shown = 0;
    for (const auto& n : names) {
      if (shown > 0) m << ", ";
      m << n;
      if (++shown == 6) {
        m << " ...";
        break;
      }
    }
    m << "]";
  }
  if (f.shut_down)
    m << "\nOne or more rank (marked by \"!\") is stalled for longer than " << shut
      << " seconds. Will shutdown.";
  f.message = m.str();
  return f;
}

bool Controller::shutdown_applies() const {
  return options_.stall_shutdown_seconds > 0 &&
         options_.stall_shutdown_seconds >= options_.stall_check_seconds;
}

void Controller::stall_check() {
  // Horovod checks once per warning period and warns again at every check while it lasts.
  const auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_stall_check_).count() <=
      options_.stall_check_seconds)
    return;
  last_stall_check_ = now;
  const StallFindings f = stall_findings();
  if (f.message.empty()) return;
  std::fprintf(stderr, "[hvd rank 0] %s: %s\n", f.shut_down ? "ERROR" : "WARNING",
               f.message.c_str());
  std::fflush(stderr);
}

}  // namespace dtrain::hvd::detail
