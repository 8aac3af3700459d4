#include "diagnosis/monitor.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "core/params.h"
#include "dtrain/error.h"

namespace dtrain::diagnosis {

namespace {

constexpr size_t kRingSize = 256;    // records kept per group
constexpr size_t kPublished = 8;     // newest records in each published Progress
constexpr size_t kShapesListed = 4;  // tensors whose shapes a record names

const char* dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kShort:
      return "int16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(t);
  }
}

std::string shapes_of(at::TensorList tensors) {
  if (tensors.empty()) return "[]";
  std::string s;
  for (size_t i = 0; i < tensors.size() && i < kShapesListed; ++i) {
    if (i) s += ' ';
    if (!tensors[i].defined()) {
      s += "undefined";
      continue;
    }
    s += '[';
    auto sizes = tensors[i].sizes();
    for (size_t d = 0; d < sizes.size(); ++d) {
      if (d) s += ", ";
      s += std::to_string(sizes[d]);
    }
    s += ']';
  }
  if (tensors.size() > kShapesListed) s += " ... (" + std::to_string(tensors.size()) + " tensors)";
  return s;
}

std::string first_line(const std::string& text) {
  auto nl = text.find('\n');
  std::string line = nl == std::string::npos ? text : text.substr(0, nl);
  if (line.size() > 300) line = line.substr(0, 300) + "...";
  return line;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::chrono::milliseconds parse_stall_env(const char* value) {
  char* end = nullptr;
  double s = std::strtod(value, &end);
  if (end == value || *end != '\0' || !(s > 0) || s > 1e7) {
    throw UsageError(
        std::string("DTRAIN_STALL_TIMEOUT='") + value +
        "' is not a positive number of seconds; set it like DTRAIN_STALL_TIMEOUT=60 (or 0.5)");
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(s * 1000 + 0.5));
}

}  // namespace

void check_environment() {
  if (const auto d = param::kDebug.get_if_set()) parse_debug_level(*d, param::kDebug.name);
  if (const auto s = param::kStallTimeout.get_if_set()) parse_stall_env(s->c_str());
}

GroupMonitor::GroupMonitor(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size)
    : store_(std::move(store)), rank_(rank), world_size_(world_size), ring_(kRingSize) {
  if (const auto d = param::kDebug.get_if_set()) level_ = parse_debug_level(*d, param::kDebug.name);
  if (const auto s = param::kStallTimeout.get_if_set())
    stall_ms_ = parse_stall_env(s->c_str()).count();
}

GroupMonitor::~GroupMonitor() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
}

void GroupMonitor::set_stall_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) {
    throw UsageError("stall_timeout must be > 0 ms, got " + std::to_string(timeout.count()) +
                     " ms");
  }
  stall_ms_ = timeout.count();
  cv_.notify_all();  // a shorter tick takes effect now
}

std::chrono::milliseconds GroupMonitor::stall_timeout() const {
  return std::chrono::milliseconds(stall_ms_.load());
}

// A quarter of the stall timeout, so a report comes at most 25% late, within [50 ms, 1 s]: the
// tick is also how stale the failure summary's records can be.
std::chrono::milliseconds GroupMonitor::tick() const {
  return std::clamp(stall_timeout() / 4, std::chrono::milliseconds(50),
                    std::chrono::milliseconds(1000));
}

void GroupMonitor::start_watchdog() {
  if (!store_) {
    // A group made without a store (a backend wrapped by hand, as unit tests do): the ring
    // buffer still records, but there is nowhere to publish progress or compare fingerprints.
    if (level_.load() == DebugLevel::kDetail) {
      std::fprintf(stderr, "dtrain: rank %d: DETAIL checks are off for a group without a store\n",
                   rank_);
    }
    level_ = DebugLevel::kInfo;
    return;
  }
  try {
    // The n-th group this rank joins on this store is g<n> on every rank (groups are joined
    // in the same order everywhere), so the ranks' keys meet without any agreement round.
    gid_ = "g" + std::to_string(store_->add(groups_key(rank_), 1));
  } catch (const std::exception& e) {
    std::fprintf(
        stderr,
        "dtrain: rank %d: the collective watchdog is off for this group: its store failed (%s)\n",
        rank_, first_line(e.what()).c_str());
    level_ = DebugLevel::kOff;
    return;
  }
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

CollectiveRecord* GroupMonitor::slot_locked(std::uint64_t seq) {
  CollectiveRecord& r = ring_[seq % ring_.size()];
  return r.seq == seq ? &r : nullptr;
}

std::uint64_t GroupMonitor::enter(const char* op, at::TensorList tensors,
                                  std::chrono::milliseconds timeout) {
  if (level_.load(std::memory_order_relaxed) == DebugLevel::kOff) return 0;
  std::call_once(started_, [this] { start_watchdog(); });
  // Again: a failed store turns the monitor off, a group without one drops DETAIL.
  const DebugLevel level = level_.load(std::memory_order_relaxed);
  if (level == DebugLevel::kOff) return 0;
  CollectiveRecord r;
  r.op = op;
  r.dtype = tensors.empty() || !tensors[0].defined() ? "-" : dtype_name(tensors[0].scalar_type());
  r.shapes = shapes_of(tensors);
  r.rank = rank_;
  r.start_time = now_epoch_seconds();
  std::string fingerprint;
  if (level == DebugLevel::kDetail) fingerprint = r.op + " " + r.dtype + " " + r.shapes;
  std::uint64_t seq;
  {
    MutexLock lock(mu_);
    seq = ++seq_;
    r.seq = seq;
    ring_[seq % ring_.size()] = std::move(r);
    ++version_;
  }
  if (level == DebugLevel::kDetail) {
    try {
      detail_check(seq, fingerprint, timeout);
    } catch (const std::exception& e) {
      fail(seq, first_line(e.what()));
      throw;
    }
  }
  return seq;
}

void GroupMonitor::finish(std::uint64_t seq, CollectiveState state, const std::string& error) {
  if (seq == 0) return;
  const double now = now_epoch_seconds();
  MutexLock lock(mu_);
  if (state == CollectiveState::kCompleted && seq > completed_) completed_ = seq;
  CollectiveRecord* r = slot_locked(seq);
  if (!r || r->state != CollectiveState::kStarted) return;  // overwritten, or already settled
  r->state = state;
  r->end_time = now;
  r->error = error;
  ++version_;
}

void GroupMonitor::complete(std::uint64_t seq) { finish(seq, CollectiveState::kCompleted, ""); }
void GroupMonitor::fail(std::uint64_t seq, const std::string& error) {
  finish(seq, CollectiveState::kFailed, first_line(error));
}
void GroupMonitor::abandon(std::uint64_t seq) { finish(seq, CollectiveState::kUnwaited, ""); }

std::vector<CollectiveRecord> GroupMonitor::recent() const {
  MutexLock lock(mu_);
  std::vector<CollectiveRecord> out;
  const std::uint64_t n = std::min<std::uint64_t>(seq_, ring_.size());
  for (std::uint64_t s = seq_ - n + 1; s <= seq_ && n > 0; ++s) {
    const CollectiveRecord& r = ring_[s % ring_.size()];
    if (r.seq == s) out.push_back(r);
  }
  return out;
}

std::optional<std::string> GroupMonitor::last_stall_report() const {
  MutexLock lock(mu_);
  return last_report_;
}

Progress GroupMonitor::snapshot_locked() const {
  Progress p;
  p.rank = rank_;
  p.world_size = world_size_;
  p.entered = seq_;
  p.completed = completed_;
  p.published_at = now_epoch_seconds();
  auto at = [&](std::uint64_t s) -> std::optional<CollectiveRecord> {
    if (s == 0) return std::nullopt;
    mu_.assert_held();  // called below, under the caller's lock
    const CollectiveRecord& r = ring_[s % ring_.size()];
    if (r.seq != s) return std::nullopt;
    return r;
  };
  p.last_entered = at(seq_);
  p.last_completed = at(completed_);
  const std::uint64_t n = std::min<std::uint64_t>(seq_, kPublished);
  for (std::uint64_t s = seq_ - n + 1; s <= seq_ && n > 0; ++s) {
    if (auto r = at(s)) p.recent.push_back(*r);
  }
  return p;
}

void GroupMonitor::publish(const Progress& progress) {
  MutexLock lock(publish_mu_);
  store_->set(progress_key(gid_, rank_), bytes(encode(progress)));
}

void GroupMonitor::publish_now() {
  if (gid_.empty() || level() == DebugLevel::kOff) return;
  Progress p;
  {
    MutexLock lock(mu_);
    p = snapshot_locked();
  }
  try {
    publish(p);
  } catch (const std::exception&) {
    // The store may be what failed; the error being raised says more than we could.
  }
}

void GroupMonitor::watchdog_loop() {
  std::uint64_t published = 0;
  bool warned = false;
  MutexLock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock.native(), tick(), [&] {
      mu_.assert_held();
      return stop_;
    });
    if (stop_) break;
    std::optional<Progress> progress;
    if (version_ != published) {
      progress = snapshot_locked();
      published = version_;
    }
    // The oldest collective still in flight that no report covered yet.
    const CollectiveRecord* stuck = nullptr;
    for (const auto& r : ring_) {
      if (r.seq > reported_ && r.state == CollectiveState::kStarted &&
          (!stuck || r.seq < stuck->seq))
        stuck = &r;
    }
    const auto stall = stall_timeout();
    std::optional<CollectiveRecord> report_on;
    if (stuck &&
        now_epoch_seconds() - stuck->start_time >= std::chrono::duration<double>(stall).count()) {
      reported_ = stuck->seq;  // one report per stuck collective, and none for older ones
      report_on = *stuck;
    }
    lock.unlock();
    try {
      if (progress) publish(*progress);
      if (report_on) {
        std::string report = stall_report(*report_on, stall);
        std::fputs(report.c_str(), stderr);
        std::fflush(stderr);
        MutexLock relock(mu_);
        last_report_ = std::move(report);
      }
    } catch (const std::exception& e) {
      if (!warned) {
        std::fprintf(
            stderr,
            "dtrain: rank %d: the collective watchdog cannot reach the store (%s); will retry\n",
            rank_, first_line(e.what()).c_str());
        warned = true;
      }
    }
    lock.lock();
  }
}

std::string GroupMonitor::stall_report(const CollectiveRecord& stuck,
                                       std::chrono::milliseconds stall) {
  const double now = now_epoch_seconds();
  std::ostringstream s;
  s << "dtrain: stall report (group " << gid_ << ", rank " << rank_ << " of " << world_size_
    << "): " << stuck.op << " #" << stuck.seq << " " << stuck.dtype << " " << stuck.shapes
    << " has waited " << seconds(now - stuck.start_time) << " (stall timeout "
    << seconds(std::chrono::duration<double>(stall).count()) << "), since "
    << format_time(stuck.start_time) << "\n";
  std::vector<int> entered{rank_};
  std::vector<std::string> behind;  // one line per rank that has not entered it
  std::vector<int> behind_ranks;
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    const std::string key = progress_key(gid_, r);
    if (!store_->check({key})) {
      behind_ranks.push_back(r);
      behind.push_back(
          "rank " + std::to_string(r) +
          ": has published no progress (no collective of this group yet, or its watchdog "
          "cannot reach the store)");
      continue;
    }
    Progress p = decode_progress(text(store_->get(key)));
    if (p.entered >= stuck.seq) {
      entered.push_back(r);
      continue;
    }
    behind_ranks.push_back(r);
    std::string line = "rank " + std::to_string(r) + ": last completed ";
    if (p.last_completed) {
      const auto& c = *p.last_completed;
      line += c.op + " #" + std::to_string(c.seq) + " " + c.dtype + " " + c.shapes + " at " +
              format_time(c.end_time) + " (" + seconds(now - c.end_time) + " ago)";
    } else {
      line += p.completed == 0 ? "none" : "#" + std::to_string(p.completed);
    }
    if (p.last_entered && p.last_entered->state == CollectiveState::kStarted) {
      line += "; in flight: " + p.last_entered->op + " #" + std::to_string(p.last_entered->seq);
    }
    line += " [as published " + seconds(now - p.published_at) + " ago]";
    behind.push_back(line);
  }
  std::sort(entered.begin(), entered.end());
  if (behind.empty()) {
    s << "  every rank has entered it (a peer may be stuck inside it, or the transport is slow)\n";
  } else {
    s << "  not entered by " << behind.size() << " rank(s): " << rank_list(behind_ranks) << "\n";
    for (const auto& l : behind) s << "    " << l << "\n";
  }
  s << "  entered by: " << rank_list(entered) << "\n";
  return s.str();
}

void GroupMonitor::detail_check(std::uint64_t seq, const std::string& fingerprint,
                                std::chrono::milliseconds timeout) {
  store_->set(detail_key(gid_, seq, rank_), bytes(fingerprint));
  std::vector<std::string> keys;
  keys.reserve(static_cast<size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) keys.push_back(detail_key(gid_, seq, r));
  // Poll with check() rather than a blocking wait(): c10d's TCPStore holds its client lock for
  // the whole of a wait(), which would keep the watchdog (and its stall report) off the store.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(20);
  while (!store_->check(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < world_size_; ++r) {
        if (!store_->check({keys[static_cast<size_t>(r)]})) missing.push_back(r);
      }
      throw TimeoutError("DTRAIN_DEBUG=detail: collective #" + std::to_string(seq) + " (" +
                         fingerprint + ") of group " + gid_ + ": rank(s) " + rank_list(missing) +
                         " did not reach it within " + std::to_string(timeout.count()) +
                         " ms (rank " + std::to_string(rank_) + " of " +
                         std::to_string(world_size_) + ")");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  std::map<std::string, std::vector<int>> by_fingerprint;
  for (int r = 0; r < world_size_; ++r) {
    by_fingerprint[r == rank_ ? fingerprint : text(store_->get(keys[static_cast<size_t>(r)]))]
        .push_back(r);
  }
  if (by_fingerprint.size() > 1) {
    // Name the minority first (usually the rank with the bug), each side with its fingerprint.
    std::vector<std::pair<std::string, std::vector<int>>> sides(by_fingerprint.begin(),
                                                                by_fingerprint.end());
    std::stable_sort(sides.begin(), sides.end(), [](const auto& a, const auto& b) {
      return a.second.size() < b.second.size();
    });
    std::string msg = "collective mismatch at #" + std::to_string(seq) + " of group " + gid_ +
                      " (seen by rank " + std::to_string(rank_) + " of " +
                      std::to_string(world_size_) + "): ";
    for (size_t i = 0; i < sides.size(); ++i) {
      msg += (i ? " but " : "") + std::string(sides[i].second.size() == 1 ? "rank " : "ranks ") +
             rank_list(sides[i].second) + " called " + sides[i].first;
    }
    msg +=
        ". Every rank must issue the same collectives, with the same dtype and shapes, in the same "
        "order "
        "(DTRAIN_DEBUG=detail checked this before anything was sent)";
    throw CollectiveMismatchError(msg);
  }
  // Every rank has published #seq, so every rank is done reading #seq-1: our key for it can go.
  if (seq > 1) store_->deleteKey(detail_key(gid_, seq - 1, rank_));
}

}  // namespace dtrain::diagnosis
