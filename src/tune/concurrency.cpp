// How many trials a search runs at once; see concurrency.h.
#include "tune/concurrency.h"

#include <algorithm>
#include <cstdio>
#include <exception>

namespace dtrain::tune::detail {

namespace {

std::string slots_text(const engines::Capacity& c) {
  return std::to_string(c.free_slots) + " free of " + std::to_string(c.total_slots) + " slots";
}

}  // namespace

Concurrency::Concurrency(Options o) : o_(std::move(o)) {
  const auto room =
      o_.cpus > 0 ? std::optional<engines::Capacity>(engines::Capacity{o_.cpus, o_.cpus, false})
                  : engines::for_job(o_.trial).capacity(o_.trial);
  int n = room ? std::max(1, room->free_slots / o_.processes) : std::max(1, o_.max_concurrent);
  if (room && o_.max_concurrent > 0) n = std::min(n, o_.max_concurrent);
  first_ = limit_ = n;
  live_ = room && room->net_of_jobs;
  asked_at_ = Clock::now();
  if (o_.verbose && !o_.engine.empty()) {
    std::fprintf(stderr, "tune: %d trial(s) at a time on engine %s (%s; %d process(es) each)\n",
                 limit_, o_.engine.c_str(),
                 room ? slots_text(*room).c_str() : "its free slots unknown", o_.processes);
  }
}

Concurrency::~Concurrency() {
  if (query_.valid()) query_.wait();
}

void Concurrency::want() {
  if (live_) wanted_ = true;
}

bool Concurrency::poll(int running, bool waiting,
                       const std::function<int(Clock::time_point)>& counted) {
  if (!waiting) wanted_ = false;
  // Room can appear while every trial still runs (a node joins): ask now and then too.
  if (live_ && waiting && !query_.valid() && Clock::now() - asked_at_ >= kWaitingInterval)
    wanted_ = true;
  if (!query_.valid()) {
    if (!wanted_ || Clock::now() < next_allowed_) return false;
    wanted_ = false;
    asked_at_ = Clock::now();
    // The engine and a copy of the job's options: nothing of the driver's is touched there.
    query_ = std::async(std::launch::async,
                        [trial = o_.trial] { return engines::for_job(trial).capacity(trial); });
    return false;
  }
  if (query_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
  const auto took = Clock::now() - asked_at_;
  next_allowed_ = took >= kSlowQuery ? asked_at_ + kSlowQueryInterval : Clock::time_point{};
  std::optional<engines::Capacity> room;
  try {
    room = query_.get();
  } catch (const std::exception& e) {
    // A count is advice: the search goes on at its present size.
    if (o_.verbose) {
      std::fprintf(stderr,
                   "tune: asking engine %s for its free slots failed (%s); %d trial(s) "
                   "at a time still\n",
                   o_.engine.c_str(), e.what(), limit_);
    }
    return false;
  }
  if (!room) return false;
  const int uncounted = std::max(0, running - counted(asked_at_));
  const int free_now = std::max(0, room->free_slots - o_.processes * uncounted);
  int n = std::max(first_, running + free_now / o_.processes);
  const bool capped = o_.max_concurrent > 0 && n > o_.max_concurrent;
  if (capped) n = o_.max_concurrent;
  if (n == limit_) return false;
  limit_ = n;
  if (o_.verbose) {
    std::fprintf(
        stderr,
        "tune: now %d trial(s) at a time on engine %s (%s, %d trial(s) of this search "
        "running; %d process(es) each%s)\n",
        limit_, o_.engine.c_str(), slots_text(*room).c_str(), running, o_.processes,
        capped ? (", max_concurrent_trials " + std::to_string(o_.max_concurrent)).c_str() : "");
  }
  return true;
}

}  // namespace dtrain::tune::detail
