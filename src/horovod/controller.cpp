#include "horovod/controller.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <set>
#include <sstream>

#include "dtrain/collectives.h"
#include "dtrain/error.h"

namespace dtrain::hvd::detail {

namespace {

// The request line: fields separated by '\t', requests by '\n'. Names may hold neither.
struct Sig {
  int64_t seq = 0;
  Kind kind = Kind::kAllreduce;
  std::string name;
  int dtype = 0;
  std::vector<int64_t> shape;
  int op = 0;
  double prescale = 1, postscale = 1;
  int compression = 0;
  int root = 0;
  std::vector<int64_t> splits;
};

std::string join_ints(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s;
}

std::vector<int64_t> split_ints(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) v.push_back(std::stoll(item));
  }
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    size_t next = s.find(sep, pos);
    out.push_back(s.substr(pos, next - pos));
    if (next == std::string::npos) break;
    pos = next + 1;
  }
  return out;
}

Sig parse_sig(const std::string& line) {
  auto f = split(line, '\t');
  DTRAIN_ASSERT(f.size() == 11, "malformed hvd request line '" + line + "'");
  Sig s;
  s.seq = std::stoll(f[0]);
  s.kind = static_cast<Kind>(std::stoi(f[1]));
  s.name = f[2];
  s.dtype = std::stoi(f[3]);
  s.shape = split_ints(f[4]);
  s.op = std::stoi(f[5]);
  s.prescale = std::stod(f[6]);
  s.postscale = std::stod(f[7]);
  s.compression = std::stoi(f[8]);
  s.root = std::stoi(f[9]);
  s.splits = split_ints(f[10]);
  return s;
}

// The line without its submission number: what must agree across ranks (for the kinds
// where shapes must be equal).
std::string strip_seq(const std::string& line) { return line.substr(line.find('\t') + 1); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  s += join_ints(shape);
  s += ']';
  return s;
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  double d = std::strtod(v, &end);
  if (end == v || *end != '\0' || d < 0) {
    throw UsageError(std::string(name) + "='" + v +
                     "' is not a non-negative number; fix or unset it");
  }
  return d;
}

}  // namespace

constexpr std::chrono::milliseconds Controller::kIdleHeartbeat;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAlltoall:
      return "alltoall";
    case Kind::kReducescatter:
      return "reducescatter";
    case Kind::kJoin:
      return "join";
    case Kind::kBarrier:
      return "barrier";
  }
  return "?";
}

const char* kind_upper(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "ALLREDUCE";
    case Kind::kAllgather:
      return "ALLGATHER";
    case Kind::kBroadcast:
      return "BROADCAST";
    case Kind::kAlltoall:
      return "ALLTOALL";
    case Kind::kReducescatter:
      return "REDUCESCATTER";
    case Kind::kJoin:
      return "JOIN";
    case Kind::kBarrier:
      return "BARRIER";
  }
  return "?";
}

void Pending::finish(torch::Tensor out, std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (done) return;
    result = std::move(out);
    error = std::move(err);
    done = true;
  }
  cv.notify_all();
}

ControllerOptions ControllerOptions::from_env() {
  ControllerOptions o;
  o.fusion_threshold = static_cast<int64_t>(
      env_double("HOROVOD_FUSION_THRESHOLD", static_cast<double>(o.fusion_threshold)));
  o.cycle_time =
      std::chrono::microseconds(static_cast<int64_t>(env_double("HOROVOD_CYCLE_TIME", 5.0) * 1000));
  o.stall_check_seconds = env_double("HOROVOD_STALL_CHECK_TIME_SECONDS", 60);
  o.stall_shutdown_seconds = env_double("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0);
  const char* off = std::getenv("HOROVOD_STALL_CHECK_DISABLE");
  o.stall_check = !(off && std::string(off) == "1");
  o.cache_capacity = static_cast<int64_t>(
      env_double("HOROVOD_CACHE_CAPACITY", static_cast<double>(o.cache_capacity)));
  if (const char* t = std::getenv("HOROVOD_TIMELINE")) o.timeline = t;
  const char* marks = std::getenv("HOROVOD_TIMELINE_MARK_CYCLES");
  o.timeline_mark_cycles = marks && std::string(marks) == "1";
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
  std::string backend = group_->backend_name();
  for (auto& c : backend) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  act_allreduce_ = backend + "_ALLREDUCE";
  act_bcast_ = backend + "_BCAST";
  act_allgather_ = backend + "_ALLGATHER";
  act_alltoall_ = backend + "_ALLTOALL";
  act_reducescatter_ = backend + "_REDUCESCATTER";
  act_adasum_ = backend + "_ADASUM_ALLREDUCE";
  if (rank_ == 0 && !options_.timeline.empty()) {
    timeline_ = std::make_unique<Timeline>(options_.timeline, options_.timeline_mark_cycles);
  }
  thread_ = std::thread([this] { loop(); });
}

Controller::~Controller() {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  std::unique_lock<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  waiters_ += delta;
}

void Controller::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  timeline_.reset();  // flushes and closes the file
}

std::string Controller::signature(const Request& r) const {
  std::ostringstream s;
  s.precision(17);
  std::vector<int64_t> shape = r.tensor.defined() ? r.tensor.sizes().vec() : std::vector<int64_t>{};
  int dtype = r.tensor.defined() ? static_cast<int>(r.tensor.scalar_type()) : -1;
  s << static_cast<int>(r.kind) << '\t' << r.name << '\t' << dtype << '\t' << join_ints(shape)
    << '\t' << static_cast<int>(r.reduce.op) << '\t' << r.reduce.prescale_factor << '\t'
    << r.reduce.postscale_factor << '\t' << static_cast<int>(r.reduce.compression) << '\t' << r.root
    << '\t' << join_ints(r.splits);
  return s.str();
}

bool Controller::cycle_due(Clock::time_point* due) {
  // When to start the next cycle (see controller.h, "When a cycle starts"). REQUIRES mu_.
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
  // REQUIRES cycle_mu_. Requests write into parameters and their gradients (leaves that
  // require grad): no autograd here (the guard is per thread, and either thread runs cycles).
  torch::NoGradGuard no_grad;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
    std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(p.mu);
      if (p.done) return;
    }
    if (Clock::now() >= deadline) return;
    Clock::time_point due = deadline;
    bool now = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cycles_done_ && !stop_requested_ && !stopped_) now = cycle_due(&due);
    }
    if (now) {
      std::unique_lock<std::mutex> cycle(cycle_mu_, std::try_to_lock);
      if (cycle.owns_lock()) {
        bool still;
        {
          std::lock_guard<std::mutex> lock(mu_);
          still = !cycles_done_ && !stop_requested_ && cycle_due(&due);
        }
        if (still) run_cycle();
        continue;
      }
      due = Clock::now() + std::chrono::milliseconds(1);  // another thread is in a cycle
    }
    std::unique_lock<std::mutex> lock(p.mu);
    p.cv.wait_until(lock, std::min(due, deadline), [&] { return p.done; });
  }
}

void Controller::loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (!cycles_done_) {
        Clock::time_point due;
        if (cycle_due(&due)) break;
        cv_.wait_until(lock, due);
      }
      if (cycles_done_) break;
    }
    std::lock_guard<std::mutex> cycle(cycle_mu_);
    {
      // A waiting caller may have run the cycle meanwhile.
      std::lock_guard<std::mutex> lock(mu_);
      Clock::time_point due;
      if (cycles_done_) break;
      if (!cycle_due(&due)) continue;
    }
    if (!run_cycle()) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

bool Controller::cacheable(Kind k) {
  return k == Kind::kAllreduce || k == Kind::kBroadcast || k == Kind::kReducescatter;
}

std::vector<int> Controller::sync_cache(bool& need_full, bool fresh_work) {
  // One sum all-reduce of int32: [ranks needing the full exchange, ranks with fresh work,
  // then per cache bit the ranks holding that request]. A bit every rank holds is ready.
  const size_t nbits = cache_names_.size();
  auto v = torch::zeros({static_cast<int64_t>(3 + nbits)}, torch::kInt32);
  auto* d = v.data_ptr<int32_t>();
  d[0] = need_full ? 1 : 0;
  d[1] = fresh_work ? 1 : 0;
  for (const auto& [bit, r] : hits_) d[3 + bit] = 1;
  AllReduceOptions ao;
  ao.group = group_;
  dtrain::all_reduce(v, ao);
  need_full = d[0] > 0;
  progressed_ = d[1] > 0;
  std::vector<int> ready;
  for (size_t b = 0; b < nbits; ++b) {
    const int have = d[3 + b];
    if (have == 0) continue;
    if (have == size_) {
      ready.push_back(static_cast<int>(b));
    } else if (timeline_) {
      auto& c = cache_.at(cache_names_[b]);
      timeline_->negotiate_start(cache_names_[b], kind_upper(c.kind));
    }
  }
  return ready;
}

void Controller::run_cached(const std::vector<int>& bits) {
  std::vector<Request> reqs;
  std::vector<Entry> entries;
  for (int b : bits) {
    auto it = hits_.find(b);
    DTRAIN_ASSERT(it != hits_.end(), "a ready cache bit this rank does not hold");
    Request r = std::move(it->second);
    hits_.erase(it);
    hit_names_.erase(r.name);
    hit_since_.erase(b);
    CacheEntry& c = cache_.at(r.name);
    c.last_used = ++exec_counter_;
    Entry e;
    e.sig.assign(static_cast<size_t>(size_),
                 "0\t" + c.sig);  // every rank's request equals the cached one
    e.seq.assign(static_cast<size_t>(size_), 0);
    e.count = size_;
    if (timeline_) {
      timeline_->negotiate_start(r.name, kind_upper(r.kind));
      timeline_->start(r.name, kind_upper(r.kind),
                       r.tensor.numel() * static_cast<int64_t>(r.tensor.element_size()));
      timeline_->activity_start(r.name, "QUEUE");
    }
    reqs.push_back(std::move(r));
    entries.push_back(std::move(e));
  }
  run_batch(reqs, entries);
}

void Controller::cache_insert(const std::string& name, const Entry& e) {
  if (options_.cache_capacity <= 0) return;
  for (const auto& line : e.sig) {
    if (line.empty() || strip_seq(line) != strip_seq(e.sig[0]))
      return;  // a joined rank, or options differ
  }
  const std::string sig = strip_seq(e.sig[0]);
  auto it = cache_.find(name);
  if (it != cache_.end()) {
    it->second.sig = sig;  // e.g. a new shape: the same bit, the new request
    it->second.kind = parse_sig(e.sig[0]).kind;
    it->second.last_used = ++exec_counter_;
    return;
  }
  int bit = -1;
  if (static_cast<int64_t>(cache_.size()) < options_.cache_capacity) {
    for (size_t b = 0; b < cache_names_.size(); ++b) {
      if (cache_names_[b].empty()) {
        bit = static_cast<int>(b);
        break;
      }
    }
    if (bit < 0) {
      bit = static_cast<int>(cache_names_.size());
      cache_names_.emplace_back();
    }
  } else {
    // Full: the least recently used entry goes (every rank counts uses alike). No rank holds
    // a request on its bit: this runs in a full exchange, where every held hit was announced.
    auto lru = cache_.begin();
    for (auto c = cache_.begin(); c != cache_.end(); ++c) {
      if (c->second.last_used < lru->second.last_used) lru = c;
    }
    bit = lru->second.bit;
    cache_.erase(lru);
  }
  cache_names_[static_cast<size_t>(bit)] = name;
  cache_.emplace(
      name, CacheEntry{sig, bit, static_cast<Kind>(parse_sig(e.sig[0]).kind), ++exec_counter_});
}

void Controller::negotiate_and_run() {
  if (timeline_) timeline_->mark_cycle_start();
  // 1. What this rank has to say: each new request is a cache hit (held under its bit) or
  // needs the full exchange.
  std::deque<Request> fresh;
  bool stopping;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(queue_);
    stopping = stop_requested_;
  }
  const bool stall_now = rank_ == 0 && !stall_flag_ && options_.stall_check &&
                         options_.stall_shutdown_seconds > 0 && !stall_report(true).empty();
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
    std::string report = stall_report(true);
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

void Controller::execute(std::vector<std::string> names) {
  // Order: the submission number on the lowest rank that submitted each name.
  auto key = [&](const std::string& n) {
    const Entry& e = table_.at(n);
    for (int r = 0; r < size_; ++r) {
      if (e.seq[static_cast<size_t>(r)] >= 0)
        return std::pair<int, int64_t>(r, e.seq[static_cast<size_t>(r)]);
    }
    return std::pair<int, int64_t>(size_, 0);
  };
  std::sort(names.begin(), names.end(),
            [&](const auto& x, const auto& y) { return key(x) < key(y); });

  // Requests that fail validation fail on every rank alike and are dropped from the run.
  std::vector<std::string> runnable;
  for (auto& n : names) {
    Entry& e = table_.at(n);
    try {
      check_agreement(n, e);
      int ref = key(n).first;
      Sig s = parse_sig(e.sig[static_cast<size_t>(ref)]);
      bool some_joined = false;
      for (int r = 0; r < size_; ++r)
        some_joined = some_joined || (e.sig[static_cast<size_t>(r)].empty());
      if (some_joined && s.kind != Kind::kAllreduce && s.kind != Kind::kAllgather &&
          s.kind != Kind::kBarrier) {
        throw UsageError(
            "hvd: " + std::string(kind_name(s.kind)) + " '" + n +
            "' while some ranks have joined; only allreduce, allgather and barrier run with "
            "joined ranks");
      }
      runnable.push_back(n);
      if (cacheable(s.kind)) cache_insert(n, e);
    } catch (const Error&) {
      if (timeline_) {
        timeline_->start(n, "ERROR", -1);
        timeline_->end(n, "", "");
      }
      auto it = mine_.find(n);
      if (it != mine_.end()) {
        it->second.pending->finish({}, std::current_exception());
        mine_.erase(it);
      }
      table_.erase(n);
    }
  }

  // Build this rank's request for each name (a joined rank contributes zeros).
  std::vector<Request> reqs;
  std::vector<Entry> entries;
  for (auto& n : runnable) {
    Entry e = std::move(table_.at(n));
    table_.erase(n);
    auto it = mine_.find(n);
    Request r;
    if (it != mine_.end()) {
      r = std::move(it->second);
      mine_.erase(it);
    } else {
      int ref = 0;
      while (e.sig[static_cast<size_t>(ref)].empty()) ++ref;
      Sig s = parse_sig(e.sig[static_cast<size_t>(ref)]);
      r.kind = s.kind;
      r.name = n;
      auto shape = s.shape;
      if (s.kind == Kind::kAllgather && !shape.empty()) shape[0] = 0;
      r.tensor =
          torch::zeros(shape, torch::TensorOptions().dtype(static_cast<c10::ScalarType>(s.dtype)));
      r.reduce.op = static_cast<ReduceOp>(s.op);
      r.reduce.prescale_factor = s.prescale;
      r.reduce.postscale_factor = s.postscale;
      r.reduce.compression = static_cast<Compression>(s.compression);
    }
    if (timeline_) {
      const int64_t bytes = r.tensor.defined()
                                ? r.tensor.numel() * static_cast<int64_t>(r.tensor.element_size())
                                : -1;
      timeline_->start(n, kind_upper(r.kind), bytes);
      timeline_->activity_start(n, "QUEUE");
    }
    reqs.push_back(std::move(r));
    entries.push_back(std::move(e));
  }
  run_batch(reqs, entries);
}

void Controller::run_batch(std::vector<Request>& reqs, std::vector<Entry>& entries) {
  // Join completes on its own (not in `names` while ranks are still missing).
  for (size_t i = 0; i < reqs.size();) {
    if (reqs[i].kind == Kind::kJoin) {
      // Every rank joined: the one whose join line was folded in last joined last.
      const int last = last_joined_;
      std::fill(joined_.begin(), joined_.end(), false);
      if (timeline_) timeline_->end(reqs[i].name, "", "");
      if (reqs[i].pending) {
        reqs[i].pending->join_last_rank = last;
        reqs[i].pending->finish(torch::tensor(static_cast<int64_t>(last)));
      }
      ++i;
      continue;
    }
    if (reqs[i].kind == Kind::kAllreduce) {
      // Fuse the run of compatible allreduces starting here.
      std::vector<Request*> group{&reqs[i]};
      int64_t bytes = reqs[i].tensor.numel() * static_cast<int64_t>(reqs[i].tensor.element_size());
      size_t j = i + 1;
      auto compatible = [&](const Request& a, const Request& b) {
        return b.kind == Kind::kAllreduce && a.tensor.scalar_type() == b.tensor.scalar_type() &&
               a.tensor.device() == b.tensor.device() && a.reduce.op == b.reduce.op &&
               a.reduce.prescale_factor == b.reduce.prescale_factor &&
               a.reduce.postscale_factor == b.reduce.postscale_factor &&
               a.reduce.compression == b.reduce.compression;
      };
      while (j < reqs.size() && compatible(reqs[i], reqs[j])) {
        int64_t b = reqs[j].tensor.numel() * static_cast<int64_t>(reqs[j].tensor.element_size());
        if (bytes + b > options_.fusion_threshold) break;
        bytes += b;
        group.push_back(&reqs[j]);
        ++j;
      }
      run_allreduce_group(group);
      i = j;
      continue;
    }
    run_one(reqs[i], entries[i]);
    ++i;
  }
}

void Controller::run_allreduce_group(std::vector<Request*>& reqs) {
  const Request& first = *reqs.front();
  const auto dtype = first.tensor.scalar_type();
  const bool floating = at::isFloatingType(dtype);
  const auto wire =
      (first.reduce.compression == Compression::fp16 && floating) ? torch::kHalf : dtype;
  AllReduceOptions ao;
  ao.group = group_;
  switch (first.reduce.op) {
    case ReduceOp::Min:
      ao.op = dtrain::ReduceOp::kMin;
      break;
    case ReduceOp::Max:
      ao.op = dtrain::ReduceOp::kMax;
      break;
    case ReduceOp::Product:
      ao.op = dtrain::ReduceOp::kProduct;
      break;
    default:
      ao.op = dtrain::ReduceOp::kSum;
      break;
  }
  const double pre = first.reduce.prescale_factor;
  double post = first.reduce.postscale_factor;
  if (first.reduce.op == ReduceOp::Average) {
    if (post == 1.0 && wire == dtype && floating) {
      // The average in the reduction itself (the shared-memory backend divides as it reduces,
      // as for DDP's buckets): no second pass over the buffer.
      ao.op = dtrain::ReduceOp::kAvg;
    } else {
      post /= size_;
    }
  }
  const bool adasum = first.reduce.op == ReduceOp::Adasum;
  // The reduction itself: a sum/min/max/product all-reduce, or Adasum per tensor.
  auto reduce = [&](torch::Tensor& buf) {
    if (!adasum) {
      dtrain::all_reduce(buf, ao);
      return;
    }
    std::vector<int64_t> counts;
    for (auto* r : reqs) counts.push_back(r->tensor.numel());
    adasum_reduce(buf, counts);
  };
  const char* reduce_activity = adasum ? act_adasum_.c_str() : act_allreduce_.c_str();
  // The timeline: every request of the group moves from QUEUE through the same activities.
  auto activity = [&](const char* what) {
    if (!timeline_) return;
    for (auto* r : reqs) timeline_->activity_start(r->name, what);
  };
  auto done = [&](Request& r, const torch::Tensor& out) {
    if (timeline_)
      timeline_->end(r.name, std::string(c10::toString(out.scalar_type())), c10::str(out.sizes()));
    if (r.pending) r.pending->finish(out);
  };
  try {
    torch::Tensor buffer;
    if (reqs.size() == 1 && wire == dtype && pre == 1.0) {
      // One tensor, nothing to convert: reduce it (or a copy) directly.
      Request& r = *reqs.front();
      buffer = (r.in_place && r.tensor.is_contiguous()) ? r.tensor : r.tensor.contiguous().clone();
      activity(reduce_activity);
      reduce(buffer);
      if (post != 1.0) buffer.mul_(post);
      if (r.in_place && !buffer.is_same(r.tensor)) r.tensor.copy_(buffer);
      done(r, r.in_place ? r.tensor : buffer);
      return;
    }
    activity("MEMCPY_IN_FUSION_BUFFER");
    int64_t total = 0;
    for (auto* r : reqs) total += r->tensor.numel();
    // The fusion buffer lives across cycles (Horovod's too): no allocation per step.
    const int64_t bytes = total * static_cast<int64_t>(c10::elementSize(wire));
    // On the tensors' device (a CUDA group fuses on the GPU).
    const auto device = first.tensor.device();
    if (!fusion_buffer_.defined() || fusion_buffer_.numel() < bytes ||
        fusion_buffer_.device() != device) {
      fusion_buffer_ = torch::empty({bytes}, torch::TensorOptions(torch::kUInt8).device(device));
    }
    buffer = fusion_buffer_.narrow(0, 0, bytes).view(wire);
    int64_t off = 0;
    for (auto* r : reqs) {
      auto slot = buffer.narrow(0, off, r->tensor.numel());
      if (pre != 1.0) {
        slot.copy_(r->tensor.reshape({-1}).mul(pre));
      } else {
        slot.copy_(r->tensor.reshape({-1}));
      }
      off += r->tensor.numel();
    }
    activity(reduce_activity);
    reduce(buffer);
    activity("MEMCPY_OUT_FUSION_BUFFER");
    // One pass scales the whole buffer (when it holds the result's dtype).
    const bool scaled = post != 1.0 && wire == dtype;
    if (scaled) buffer.mul_(post);
    off = 0;
    for (auto* r : reqs) {
      auto slot = buffer.narrow(0, off, r->tensor.numel()).view(r->tensor.sizes());
      off += r->tensor.numel();
      torch::Tensor out;
      if (r->in_place) {
        r->tensor.copy_(slot);
        if (post != 1.0 && !scaled) r->tensor.mul_(post);
        out = r->tensor;
      } else {
        out = slot.to(dtype, /*non_blocking=*/false, /*copy=*/true);
        if (post != 1.0 && !scaled) out.mul_(post);
      }
      done(*r, out);
    }
  } catch (...) {
    for (auto* r : reqs) {
      if (r->pending) r->pending->finish({}, std::current_exception());
    }
    throw;
  }
}

void Controller::adasum_reduce(torch::Tensor& buffer, const std::vector<int64_t>& counts) {
  // Recursive doubling: at distance d = 1, 2, 4, ... each rank swaps its vector with rank ^ d
  // and both combine the pair alike - a from the lower group, b from the upper - tensor by
  // tensor: a' = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b (a coefficient is 1 when its
  // norm is ~0). After log2(size) levels every rank holds
  // adasum(adasum(adasum(g0, g1), adasum(g2, g3)), ...). Dot products and the combination run
  // in float64; every level sends the whole vector (Horovod halves it per level instead).
  DTRAIN_ASSERT((size_ & (size_ - 1)) == 0, "Adasum on a size that is not a power of 2");
  const auto dtype = buffer.scalar_type();
  auto mine = buffer.reshape({-1}).to(torch::kFloat64);
  auto theirs = torch::empty_like(mine);
  PointToPointOptions po;
  po.group = group_;
  po.tag = 0x4164;  // "Ad"
  const double tiny = std::sqrt(std::numeric_limits<double>::min());
  for (int d = 1; d < size_; d <<= 1) {
    const int peer = rank_ ^ d;
    Work s = dtrain::send_async(mine, peer, po);
    Work r = dtrain::recv_async(theirs, peer, po);
    s.wait();
    r.wait();
    const bool lower = (rank_ & d) == 0;
    auto a = lower ? mine : theirs;
    auto b = lower ? theirs : mine;
    auto out = torch::empty_like(mine);
    int64_t off = 0;
    for (int64_t n : counts) {
      auto sa = a.narrow(0, off, n), sb = b.narrow(0, off, n);
      const double dot = sa.dot(sb).item<double>();
      const double na = sa.dot(sa).item<double>(), nb = sb.dot(sb).item<double>();
      const double ca = na >= tiny ? 1.0 - dot / na * 0.5 : 1.0;
      const double cb = nb >= tiny ? 1.0 - dot / nb * 0.5 : 1.0;
      auto slot = out.narrow(0, off, n);
      torch::add_out(slot, sa.mul(ca), sb, cb);
      off += n;
    }
    mine = out;
  }
  buffer.copy_(mine.view(buffer.sizes()).to(dtype));
}

void Controller::run_one(Request& req, Entry& entry) {
  try {
    torch::Tensor out;
    std::vector<Sig> sigs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      if (!entry.sig[static_cast<size_t>(r)].empty())
        sigs[static_cast<size_t>(r)] = parse_sig(entry.sig[static_cast<size_t>(r)]);
    }
    if (timeline_) {
      const char* act = req.kind == Kind::kBroadcast       ? act_bcast_.c_str()
                        : req.kind == Kind::kAllgather     ? act_allgather_.c_str()
                        : req.kind == Kind::kAlltoall      ? act_alltoall_.c_str()
                        : req.kind == Kind::kReducescatter ? act_reducescatter_.c_str()
                                                           : nullptr;
      if (act) {
        timeline_->activity_start(req.name, act);
      } else {
        timeline_->activity_end(req.name);
      }
    }
    switch (req.kind) {
      case Kind::kBarrier:
        break;  // every rank submitted it: the negotiation was the barrier
      case Kind::kBroadcast: {
        BroadcastOptions bo;
        bo.group = group_;
        bo.src = req.root;
        out = req.in_place && req.tensor.is_contiguous() ? req.tensor
                                                         : req.tensor.contiguous().clone();
        dtrain::broadcast(out, bo);
        if (req.in_place && !out.is_same(req.tensor)) req.tensor.copy_(out);
        if (req.in_place) out = req.tensor;
        break;
      }
      case Kind::kAllgather: {
        std::vector<int64_t> rows(static_cast<size_t>(size_), 0);
        int64_t most = 0;
        for (int r = 0; r < size_; ++r) {
          const auto& s = sigs[static_cast<size_t>(r)];
          rows[static_cast<size_t>(r)] =
              entry.sig[static_cast<size_t>(r)].empty() || s.shape.empty() ? 0 : s.shape[0];
          most = std::max(most, rows[static_cast<size_t>(r)]);
        }
        auto tail = req.tensor.sizes().vec();
        if (tail.empty()) tail.push_back(1);
        tail[0] = most;
        auto padded = torch::zeros(tail, req.tensor.options());
        auto mine = req.tensor.dim() == 0 ? req.tensor.reshape({1}) : req.tensor;
        if (mine.size(0) > 0) padded.narrow(0, 0, mine.size(0)).copy_(mine);
        CollectiveOptions co;
        co.group = group_;
        auto parts = dtrain::all_gather(padded, co);
        std::vector<torch::Tensor> pieces;
        for (int r = 0; r < size_; ++r)
          pieces.push_back(
              parts[static_cast<size_t>(r)].narrow(0, 0, rows[static_cast<size_t>(r)]));
        out = torch::cat(pieces, 0);
        break;
      }
      case Kind::kAlltoall: {
        // Pad every (sender, receiver) chunk to the largest one, exchange equal chunks.
        int64_t most = 0;
        for (const auto& s : sigs) {
          for (auto v : s.splits) most = std::max(most, v);
        }
        auto shape = req.tensor.sizes().vec();
        shape[0] = most * size_;
        auto send = torch::zeros(shape, req.tensor.options());
        int64_t off = 0;
        for (int j = 0; j < size_; ++j) {
          int64_t n = req.splits[static_cast<size_t>(j)];
          if (n > 0) send.narrow(0, j * most, n).copy_(req.tensor.narrow(0, off, n));
          off += n;
        }
        auto recv = torch::empty_like(send);
        CollectiveOptions co;
        co.group = group_;
        dtrain::all_to_all(recv, send, co);
        std::vector<torch::Tensor> pieces;
        std::vector<int64_t> received;
        for (int r = 0; r < size_; ++r) {
          int64_t n = sigs[static_cast<size_t>(r)].splits[static_cast<size_t>(rank_)];
          received.push_back(n);
          pieces.push_back(recv.narrow(0, r * most, n));
        }
        out = torch::cat(pieces, 0);
        if (req.pending) req.pending->extra = torch::tensor(received, torch::kInt64);
        break;
      }
      case Kind::kReducescatter: {
        auto sum = req.tensor.contiguous().clone();
        AllReduceOptions ao;
        ao.group = group_;
        dtrain::all_reduce(sum, ao);
        if (req.reduce.op == ReduceOp::Average) sum.div_(size_);
        const int64_t n = sum.size(0), base = n / size_, extra = n % size_;
        const int64_t start = rank_ * base + std::min<int64_t>(rank_, extra);
        out = sum.narrow(0, start, base + (rank_ < extra ? 1 : 0)).clone();
        break;
      }
      default:
        DTRAIN_ASSERT(false, "unexpected request kind in run_one");
    }
    if (timeline_) {
      timeline_->end(req.name, out.defined() ? std::string(c10::toString(out.scalar_type())) : "",
                     out.defined() ? c10::str(out.sizes()) : "");
    }
    if (req.pending) req.pending->finish(out);
  } catch (...) {
    if (req.pending) req.pending->finish({}, std::current_exception());
    throw;
  }
}

void Controller::fail_all(const std::string& why, bool timeout) {
  std::deque<Request> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
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

std::string Controller::stall_report(bool for_shutdown) {
  const double limit =
      for_shutdown ? options_.stall_shutdown_seconds : options_.stall_check_seconds;
  const auto now = Clock::now();
  std::map<int, std::vector<std::string>> missing;  // rank -> names it has not submitted
  for (auto& [name, e] : table_) {
    if (e.count == 0 || e.count == size_) continue;
    if (std::chrono::duration<double>(now - e.first_seen).count() < limit) continue;
    if (!for_shutdown && e.warned) continue;
    for (int r = 0; r < size_; ++r) {
      if (e.sig[static_cast<size_t>(r)].empty() && !joined_[static_cast<size_t>(r)])
        missing[r].push_back(name);
    }
  }
  if (missing.empty()) return "";
  std::ostringstream m;
  m << "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of "
       "ranks and are "
       "waiting for remainder of ranks for more than "
    << limit
    << " seconds. This may indicate that different ranks are trying to submit different tensors or "
       "that only subset of ranks is submitting tensors, which will cause deadlock.\nMissing "
       "ranks:";
  for (auto& [r, names] : missing) {
    m << "\n" << r << ": [";
    for (size_t i = 0; i < names.size() && i < 5; ++i) m << (i ? ", " : "") << names[i];
    if (names.size() > 5) m << " ...";
    m << "]";
  }
  return m.str();
}

void Controller::stall_check() {
  const auto now = Clock::now();
  if (now - last_stall_check_ < std::chrono::milliseconds(100)) return;
  last_stall_check_ = now;
  std::string report = stall_report(false);
  if (report.empty()) return;
  for (auto& [name, e] : table_) {
    if (e.count > 0 && e.count < size_ &&
        std::chrono::duration<double>(now - e.first_seen).count() >= options_.stall_check_seconds) {
      e.warned = true;
    }
  }
  std::fprintf(stderr, "[hvd rank 0] WARNING: %s\n", report.c_str());
  std::fflush(stderr);
}

}  // namespace dtrain::hvd::detail
