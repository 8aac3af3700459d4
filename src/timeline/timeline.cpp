// The timeline recorder: spans in memory, one Chrome-trace file per rank, merged by rank 0.
#include "dtrain/timeline.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/params.h"
#include "core/thread_annotations.h"
#include "dtrain/error.h"
#include "timeline/chrome_trace.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace dtrain::timeline {

namespace detail {
std::atomic<bool> g_enabled{false};

int64_t now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace detail

namespace {

struct Event {
  const char* name;
  const char* category;
  int tid;
  int64_t begin, end, bytes, index;
};

struct State {
  Mutex mu;
  std::vector<Event> events DTRAIN_GUARDED_BY(mu);
  std::string path DTRAIN_GUARDED_BY(mu);
  int rank DTRAIN_GUARDED_BY(mu) = 0;
  int world DTRAIN_GUARDED_BY(mu) = 1;
  int next_tid DTRAIN_GUARDED_BY(mu) = 0;
};

State& state() {
  static State* s = new State;  // never destroyed: spans may end during static destruction
  return *s;
}

int thread_tid() {
  thread_local int tid = -1;
  if (tid < 0) {
    MutexLock lk(state().mu);
    tid = state().next_tid++;
  }
  return tid;
}

std::string rank_file(const std::string& path, int rank) {
  return path + ".rank" + std::to_string(rank) + ".json";
}

// For every span that directly encloses kWaitForPeers spans on its thread (a collective on
// the shared-memory backend), the microseconds of those waits; -1 for every other span.
std::vector<int64_t> waits_for_peers(const std::vector<Event>& events) {
  std::vector<int64_t> waited(events.size(), -1);
  // Spans of one thread nest (a Span is scoped), so ordered by begin (the longer first on a
  // tie) a stack of open spans finds each wait's parent.
  std::vector<size_t> order(events.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const Event &x = events[a], &y = events[b];
    if (x.tid != y.tid) return x.tid < y.tid;
    if (x.begin != y.begin) return x.begin < y.begin;
    if (x.end != y.end) return x.end > y.end;
    // Equal to the microsecond: the wait is the inner one.
    return std::strcmp(x.name, kWaitForPeers) != 0 && std::strcmp(y.name, kWaitForPeers) == 0;
  });
  std::vector<size_t> open;
  for (size_t i : order) {
    const Event& e = events[i];
    while (!open.empty() &&
           (events[open.back()].tid != e.tid || events[open.back()].end <= e.begin))
      open.pop_back();
    if (std::strcmp(e.name, kWaitForPeers) == 0 && !open.empty()) {
      int64_t& w = waited[open.back()];
      w = std::max<int64_t>(w, 0) + (e.end - e.begin);
    }
    open.push_back(i);
  }
  return waited;
}

void write_rank_file(const std::string& file, int rank, const std::vector<Event>& events) {
  using trace::Event;
  std::vector<std::string> out;
  auto meta = [&](const char* name, const Event& args, int tid = -1) {
    Event m;
    m.str("ph", "M").str("name", name).num("pid", rank);
    if (tid >= 0) m.num("tid", tid);
    out.push_back(m.obj("args", args).text());
  };
  meta("process_name", Event().str("name", "rank " + std::to_string(rank)));
  meta("process_sort_index", Event().num("sort_index", rank));
  int max_tid = -1;
  for (const auto& e : events) max_tid = std::max(max_tid, e.tid);
  for (int t = 0; t <= max_tid; ++t)
    meta("thread_name", Event().str("name", t == 0 ? "main" : "thread " + std::to_string(t)), t);
  const std::vector<int64_t> waited = waits_for_peers(events);
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    Event j;
    j.str("name", e.name).str("cat", e.category).str("ph", "X").num("pid", rank);
    j.num("tid", e.tid).num("ts", e.begin).num("dur", e.end - e.begin);
    Event args;
    if (e.bytes >= 0) args.num("bytes", e.bytes);
    if (e.index >= 0) args.num("index", e.index);
    if (waited[i] >= 0) {
      args.num("wait_for_peers_us", waited[i]);
      args.num("transfer_us", std::max<int64_t>(0, e.end - e.begin - waited[i]));
    }
    if (!args.empty()) j.obj("args", args);
    out.push_back(j.text());
  }
  trace::write_object_file(file, out);
}

void stop_at_exit() {
  if (enabled()) {
    try {
      stop();
    } catch (const std::exception& e) {
      std::cerr << "dtrain timeline: " << e.what() << std::endl;
    }
  }
}

// DTRAIN_TIMELINE=FILE starts recording when the library loads.
struct FromEnv {
  FromEnv() {
    const auto path = param::kTimeline.get_if_set();
    if (!path) return;
    const char* r = std::getenv("RANK");
    const char* w = std::getenv("WORLD_SIZE");
    start(*path, r ? std::atoi(r) : 0, w ? std::atoi(w) : 1);
  }
} from_env;

}  // namespace

namespace detail {
void record(const char* name, const char* category, int64_t begin_us, int64_t end_us, int64_t bytes,
            int64_t index) noexcept {
  int tid = thread_tid();
  MutexLock lk(state().mu);
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  state().events.push_back({name, category, tid, begin_us, end_us, bytes, index});
}
}  // namespace detail

void start(const std::string& path, int rank, int world_size) {
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(stop_at_exit); });
  MutexLock lk(state().mu);
  state().path = path;
  state().rank = rank;
  state().world = world_size;
  state().events.clear();
  state().events.reserve(1 << 16);
  thread_local bool named = false;
  (void)named;
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

std::string stop() {
  std::vector<Event> events;
  std::string path;
  int rank, world;
  {
    MutexLock lk(state().mu);
    detail::g_enabled.store(false, std::memory_order_relaxed);
    events.swap(state().events);
    path = state().path;
    rank = state().rank;
    world = state().world;
  }
  std::string mine = rank_file(path, rank);
  write_rank_file(mine, rank, events);
  if (rank != 0) return mine;
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::seconds(param::kTimelineMergeTimeout.get_or_warn());
  std::vector<std::string> files;
  for (int r = 0; r < world; ++r) {
    std::string f = rank_file(path, r);
    while (!fs::exists(f) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (fs::exists(f)) {
      files.push_back(f);
    } else {
      std::cerr << "dtrain timeline: warning: rank " << r << " wrote no timeline (" << f
                << ") in time; merging the other ranks" << std::endl;
    }
  }
  merge(files, path);
  for (const auto& f : files) fs::remove(f);
  return path;
}

void merge(const std::vector<std::string>& rank_files, const std::string& out) {
  // Each rank file is read as JSON (a damaged one is an error naming it); its events go into
  // the merged file as the text they were read as.
  std::vector<std::string> all;
  for (const auto& f : rank_files) {
    std::ifstream in(f);
    json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("traceEvents") || !j.at("traceEvents").is_array())
      throw Error("timeline: " + f + " is not a Chrome trace ({\"traceEvents\": [...]})");
    for (const auto& e : j.at("traceEvents")) all.push_back(e.dump());
  }
  trace::write_object_file(out, all);
}

}  // namespace dtrain::timeline
