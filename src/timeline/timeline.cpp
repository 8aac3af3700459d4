// The timeline recorder: spans in memory, one Chrome-trace file per rank, merged by rank 0.
#include "dtrain/timeline.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace fs = std::filesystem;
using nlohmann::json;

namespace dtrain::timeline {

namespace detail {
std::atomic<bool> g_enabled{false};

int64_t now_us() noexcept {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
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
  std::mutex mu;
  std::vector<Event> events;
  std::string path;
  int rank = 0, world = 1;
  int next_tid = 0;
};

State& state() {
  static State* s = new State;  // never destroyed: spans may end during static destruction
  return *s;
}

int thread_tid() {
  thread_local int tid = -1;
  if (tid < 0) {
    std::lock_guard lk(state().mu);
    tid = state().next_tid++;
  }
  return tid;
}

std::string rank_file(const std::string& path, int rank) { return path + ".rank" + std::to_string(rank) + ".json"; }

void write_rank_file(const std::string& file, int rank, const std::vector<Event>& events) {
  json ev = json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  int max_tid = -1;
  for (const auto& e : events) max_tid = std::max(max_tid, e.tid);
  for (int t = 0; t <= max_tid; ++t) {
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t},
                  {"args", {{"name", t == 0 ? std::string("main") : "thread " + std::to_string(t)}}}});
  }
  for (const auto& e : events) {
    json j{{"name", e.name}, {"cat", e.category}, {"ph", "X"}, {"pid", rank}, {"tid", e.tid},
           {"ts", e.begin}, {"dur", e.end - e.begin}};
    if (e.bytes >= 0 || e.index >= 0) {
      j["args"] = json::object();
      if (e.bytes >= 0) j["args"]["bytes"] = e.bytes;
      if (e.index >= 0) j["args"]["index"] = e.index;
    }
    ev.push_back(std::move(j));
  }
  std::string tmp = file + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp);
    f << json{{"traceEvents", ev}, {"displayTimeUnit", "ms"}}.dump();
  }
  fs::rename(tmp, file);
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
    const char* path = std::getenv("DTRAIN_TIMELINE");
    if (!path || !*path) return;
    const char* r = std::getenv("RANK");
    const char* w = std::getenv("WORLD_SIZE");
    start(path, r ? std::atoi(r) : 0, w ? std::atoi(w) : 1);
  }
} from_env;

}  // namespace

namespace detail {
void record(const char* name, const char* category, int64_t begin_us, int64_t end_us, int64_t bytes,
            int64_t index) noexcept {
  int tid = thread_tid();
  std::lock_guard lk(state().mu);
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  state().events.push_back({name, category, tid, begin_us, end_us, bytes, index});
}
}  // namespace detail

void start(const std::string& path, int rank, int world_size) {
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(stop_at_exit); });
  std::lock_guard lk(state().mu);
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
    std::lock_guard lk(state().mu);
    detail::g_enabled.store(false, std::memory_order_relaxed);
    events.swap(state().events);
    path = state().path;
    rank = state().rank;
    world = state().world;
  }
  std::string mine = rank_file(path, rank);
  write_rank_file(mine, rank, events);
  if (rank != 0) return mine;
  const char* t = std::getenv("DTRAIN_TIMELINE_MERGE_TIMEOUT");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(t ? std::atoi(t) : 30);
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
  json all = json::array();
  for (const auto& f : rank_files) {
    std::ifstream in(f);
    json j = json::parse(in);
    for (auto& e : j.at("traceEvents")) all.push_back(std::move(e));
  }
  std::string tmp = out + ".tmp" + std::to_string(getpid());
  {
    std::ofstream f(tmp);
    f << json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump();
  }
  fs::rename(tmp, out);
}

}  // namespace dtrain::timeline
