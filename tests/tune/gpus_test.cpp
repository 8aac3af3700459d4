// GPUs per trial (TrialResources::gpus, TuneOptions::num_gpus) against Ray Tune 2.60 itself:
// the same searches run by the venv's Ray (tests/tune/ray_gpus_peer.py, a local Ray with the
// GPUs declared, as ray.init(num_gpus=N) declares them on this CPU-only machine) and by dtrain,
// with 1 and 2 processes per trial, comparing what each trial's processes saw in
// CUDA_VISIBLE_DEVICES and how many trials ran at once. Then the pool's own rules (Ray's raylet
// allocation) and the options' errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "dtrain/tune.h"
#include "support/paths.h"
#include "tune/gpu_pool.h"

namespace fs = std::filesystem;
using namespace dtrain::tune;
using dtrain::tune::detail::gpu_units;
using dtrain::tune::detail::GpuPool;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p =
      fs::temp_directory_path() / ("dtrain-tune-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int count_prefix(const fs::path& dir, const std::string& prefix) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    n += e.path().filename().string().rfind(prefix, 0) == 0;
  return n;
}

// The trainable ray_gpus_peer.py gives Ray, on every process of a trial: each writes
// DIR/seen-I-RANK.json with its CUDA_VISIBLE_DEVICES (null: unset); rank 0 waits (30 s at most)
// until `want` trials are live or every trial has started, and times the trial, its end taken
// after it left the live trials.
void gpu_trainable(Config config) {
  const double start = wall_now();
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  const char* rank_env = std::getenv("RANK");
  const int rank = rank_env ? std::atoi(rank_env) : 0;
  const fs::path dir = config.at("dir").get<std::string>();
  const int i = config.at("i").get<int>();
  Config seen = {{"cvd", cvd ? Config(cvd) : Config(nullptr)}, {"start", start}};
  if (rank == 0) {
    std::ofstream(dir / ("started-" + std::to_string(i)));
    const fs::path live = dir / ("live-" + std::to_string(i));
    std::ofstream(live).close();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline &&
           count_prefix(dir, "live-") < config.at("want").get<int>() &&
           count_prefix(dir, "started-") < config.at("trials").get<int>())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    fs::remove(live);
  }
  seen["end"] = wall_now();
  const fs::path tmp = dir / ("tmp-" + std::to_string(i) + "-" + std::to_string(rank));
  std::ofstream(tmp) << seen.dump();
  fs::rename(tmp, dir / ("seen-" + std::to_string(i) + "-" + std::to_string(rank) + ".json"));
  report({{"done_i", i}});
}

// One search, as the peer's cases.json has it.
struct Case {
  std::string name;
  int cpus;                    // the node's (Ray's num_cpus)
  int gpus;                    // declared (num_gpus)
  const char* driver_devices;  // CUDA_VISIBLE_DEVICES when the search starts; nullptr: unset
  double cpu_per_trial;        // Ray's "cpu"
  double gpu_per_trial;        // Ray's "gpu", dtrain's trial_resources.gpus
  int trials;
  int want;    // trials at once the resources allow
  bool exact;  // the ids the trials hold are determined (compare them as a multiset)
  // RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO for the search (nullptr: unset), and whether every
  // trial is then to see "" (Ray's reading of the value decides, on both sides).
  const char* override_on_zero = nullptr;
  bool sees_empty = false;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      // Whole GPUs: 2 at once of the 4 CPUs' 4; which trial gets which id follows the timing.
      {"whole", 4, 2, nullptr, 1, 1, 4, 2, false},
      // Fractions pack: four halves on 2 GPUs, two on each.
      {"half", 4, 2, nullptr, 1, 0.5, 4, 4, true},
      // Two halves at once (the CPUs' limit): both on GPU 0, the best fit, never on GPU 1.
      {"packed", 4, 2, nullptr, 2, 0.5, 4, 2, true},
      // 0 GPUs on a node that has some: CUDA_VISIBLE_DEVICES left as the driver's (unset).
      {"zero", 4, 2, nullptr, 1, 0, 4, 4, true},
      // The driver's own list: the ids name its entries; a 0-GPU trial keeps the whole list.
      {"mapped", 4, 2, "3,5", 1, 1, 2, 2, true},
      {"mapped_zero", 4, 2, "3,5", 1, 0, 2, 2, true},
      // RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1: a 0-GPU trial gets "" instead (Ray before 2.47);
      // on a node without GPUs too, any case of "true"; a value Ray's env_bool does not take
      // ("yes") leaves the driver's list.
      {"override_zero", 4, 2, "3,5", 1, 0, 2, 2, true, "1", true},
      {"override_nogpu", 4, 0, "3,5", 1, 0, 2, 2, true, "True", true},
      {"override_yes", 4, 0, "3,5", 1, 0, 2, 2, true, "yes", false},
  };
  return c;
}

// What a search's trials saw: per trial, each rank's file.
struct Seen {
  std::vector<std::vector<Config>> ranks;  // [trial][rank]
};

Seen read_seen(const fs::path& dir, int trials, int processes) {
  Seen s;
  for (int i = 0; i < trials; ++i) {
    s.ranks.emplace_back();
    for (int r = 0; r < processes; ++r) {
      std::ifstream in(dir / ("seen-" + std::to_string(i) + "-" + std::to_string(r) + ".json"));
      s.ranks.back().push_back(in ? Config::parse(in) : Config(nullptr));
    }
  }
  return s;
}

// A CUDA_VISIBLE_DEVICES as a sorted list of its entries ("<unset>" for null).
std::vector<std::string> id_list(const Config& cvd) {
  if (cvd.is_null()) return {"<unset>"};
  std::vector<std::string> out;
  std::stringstream in(cvd.get<std::string>());
  for (std::string d; std::getline(in, d, ',');) out.push_back(d);
  std::sort(out.begin(), out.end());
  return out;
}

// The most trials whose [start, end) overlap at one time.
int most_at_once(const std::vector<Config>& firsts) {
  int most = 0;
  for (const auto& a : firsts) {
    const double t = a.at("start").get<double>();
    int n = 0;
    for (const auto& b : firsts)
      n += b.at("start").get<double>() <= t && t < b.at("end").get<double>();
    most = std::max(most, n);
  }
  return most;
}

// Over every time a trial started: per id, the GPU share the trials then running held on it (a
// trial of g < 1 holds g of its one id; of a whole number, each of its ids whole).
double most_on_one_gpu(const std::vector<Config>& firsts, double g) {
  double most = 0;
  for (const auto& a : firsts) {
    const double t = a.at("start").get<double>();
    std::map<std::string, double> held;
    for (const auto& b : firsts) {
      if (!(b.at("start").get<double>() <= t && t < b.at("end").get<double>())) continue;
      for (const auto& id : id_list(b.at("cvd"))) held[id] += std::min(g, 1.0);
    }
    for (const auto& [id, share] : held) most = std::max(most, share);
  }
  return most;
}

// Runs one case in dtrain with `processes` per trial, into dir.
void run_dtrain(const Case& c, int processes, const fs::path& dir) {
  fs::create_directories(dir / "sync");
  TuneOptions o;
  o.num_cpus = static_cast<int>(c.cpus / c.cpu_per_trial) * processes;  // the same trials at once
  o.num_gpus = c.gpus;
  o.trial_resources = {.processes = processes, .gpus = c.gpu_per_trial};
  o.storage_path = (dir / "storage").string();
  o.name = c.name;
  o.verbose = false;
  if (c.driver_devices) o.env["CUDA_VISIBLE_DEVICES"] = c.driver_devices;
  if (c.override_on_zero) o.env["RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"] = c.override_on_zero;
  Tuner tuner(gpu_trainable,
              {{"i", grid_search([&] {
                  std::vector<Config> v;
                  for (int i = 0; i < c.trials; ++i) v.emplace_back(i);
                  return v;
                }())},
               {"dir", (dir / "sync").string()},
               {"want", c.want},
               {"trials", c.trials}},
              o);
  const ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.num_errors(), 0) << c.name << ": " << grid.trials().front().error;
}

}  // namespace

// Every case in Ray (the peer, run meanwhile) and in dtrain with 1 and 2 processes per trial.
// Compared: the most trials at once (the rendezvous makes it what the resources allow); each
// trial's number of ids; the ids used; where determined (fractions packed, 0 GPUs, the driver's
// list), each trial's ids as a multiset over the trials; and, in dtrain, that every process of a
// trial saw the same list and no GPU held more than its capacity at once.
TEST(TuneGpus, TrialsSeeTheirGpusAsInRay) {
  const fs::path dir = fresh_dir("gpus");
  ::unsetenv("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO");  // set per case, on both sides
  ::unsetenv(
      "CUDA_VISIBLE_DEVICES");  // the driver's list, where a case sets one, is TuneOptions::env
  Config spec = {{"sync", (dir / "ray").string()}, {"cases", Config::array()}};
  for (const auto& c : cases()) {
    Config resources = {{"cpu", c.cpu_per_trial}};
    if (c.gpu_per_trial > 0 || c.name == "zero") resources["gpu"] = c.gpu_per_trial;
    spec["cases"].push_back(
        {{"name", c.name},
         {"cpus", c.cpus},
         {"gpus", c.gpus},
         {"driver_devices", c.driver_devices ? Config(c.driver_devices) : Config(nullptr)},
         {"override_on_zero", c.override_on_zero ? Config(c.override_on_zero) : Config(nullptr)},
         {"resources", resources},
         {"trials", c.trials},
         {"want", c.want}});
  }
  fs::create_directories(dir / "ray");
  std::ofstream(dir / "cases.json") << spec.dump(1);
  const std::string cmd = "timeout -k 10 600 " + std::string(dtrain::test::venv_python()) + " " +
                          dtrain::test::source_dir() + "/tests/tune/ray_gpus_peer.py " +
                          (dir / "cases.json").string() + " " + (dir / "ray.json").string() + " >" +
                          (dir / "peer.log").string() + " 2>&1";
  int peer_rc = -1;
  std::thread peer([&] { peer_rc = std::system(cmd.c_str()); });

  std::map<std::pair<std::string, int>, Seen> ours;
  for (const auto& c : cases()) {
    for (int processes : {1, 2}) {
      const fs::path d = dir / (c.name + "-" + std::to_string(processes));
      try {
        run_dtrain(c, processes, d);
      } catch (const std::exception& e) {
        ADD_FAILURE() << c.name << " with " << processes << " process(es): " << e.what();
      }
      ours[{c.name, processes}] = read_seen(d / "sync", c.trials, processes);
    }
  }
  peer.join();
  ASSERT_EQ(peer_rc, 0) << "Ray Tune peer failed: " << cmd << " (log: " << (dir / "peer.log")
                        << ")";
  std::ifstream in(dir / "ray.json");
  const Config ray = Config::parse(in);

  for (const auto& c : cases()) {
    std::vector<Config> theirs = ray.at(c.name).get<std::vector<Config>>();
    ASSERT_EQ(static_cast<int>(theirs.size()), c.trials) << c.name;
    std::multiset<std::string> their_ids;
    std::multiset<std::size_t> their_counts;
    for (const auto& t : theirs) {
      for (const auto& id : id_list(t.at("cvd"))) their_ids.insert(id);
      their_counts.insert(t.at("cvd").is_null() ? 0 : id_list(t.at("cvd")).size());
    }
    EXPECT_EQ(most_at_once(theirs), c.want) << c.name << ": Ray's own run";
    for (int processes : {1, 2}) {
      const std::string what = c.name + " with " + std::to_string(processes) + " process(es)";
      const Seen& s = ours.at({c.name, processes});
      std::vector<Config> firsts;
      std::multiset<std::string> our_ids;
      std::multiset<std::size_t> our_counts;
      bool complete = true;
      for (int i = 0; i < c.trials; ++i) {
        for (int r = 0; r < processes; ++r) {
          if (s.ranks[i][r].is_null()) {
            ADD_FAILURE() << what << ": trial " << i << " rank " << r << " wrote nothing";
            complete = false;
          } else {
            EXPECT_EQ(s.ranks[i][r].at("cvd"), s.ranks[i][0].at("cvd"))
                << what << ": trial " << i << " rank " << r << " saw other GPUs than rank 0";
          }
        }
        if (!complete) break;
        const Config& t = s.ranks[i][0];
        firsts.push_back(t);
        for (const auto& id : id_list(t.at("cvd"))) our_ids.insert(id);
        our_counts.insert(t.at("cvd").is_null() ? 0 : id_list(t.at("cvd")).size());
      }
      if (!complete) continue;
      EXPECT_EQ(most_at_once(firsts), most_at_once(theirs)) << what;
      EXPECT_EQ(our_counts, their_counts) << what << ": GPUs per trial";
      EXPECT_EQ(std::set<std::string>(our_ids.begin(), our_ids.end()),
                std::set<std::string>(their_ids.begin(), their_ids.end()))
          << what << ": the ids used";
      if (c.exact) {
        EXPECT_EQ(our_ids, their_ids) << what << ": the ids each trial held";
      }
      if (c.sees_empty) {
        for (int i = 0; i < c.trials; ++i) {
          EXPECT_EQ(s.ranks[i][0].at("cvd"), "") << what << ": trial " << i;
          EXPECT_EQ(theirs[i].at("cvd"), "") << c.name << ": Ray's trial " << i;
        }
      }
      if (c.gpu_per_trial > 0) {
        EXPECT_LE(most_on_one_gpu(firsts, c.gpu_per_trial), 1.0 + 1e-9)
            << what << ": a GPU held beyond its capacity";
      }
    }
  }
  fs::remove_all(dir);
}

// PBT's trainable: a curve to iteration 8 from its checkpoint; every run writes
// RUNS/run-ID-N.json: {"cvd", "start", "end"} (the end as it returns or is stopped or paused).
void pbt_gpu_trainable(Config config) {
  struct Run {
    Config seen;
    fs::path file;
    ~Run() {
      seen["end"] = wall_now();
      std::ofstream(file) << seen.dump();
    }
  } run;
  const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
  run.seen = {{"cvd", cvd ? Config(cvd) : Config(nullptr)}, {"start", wall_now()}};
  run.file = fs::path(config.at("runs").get<std::string>()) /
             ("run-" + trial_id() + "-" + std::to_string(::getpid()) + ".json");
  int start = 0;
  if (auto ckpt = get_checkpoint()) std::ifstream(fs::path(*ckpt) / "state") >> start;
  const double q = config.at("q").get<double>();
  for (int it = start + 1; it <= 8; ++it) {
    const fs::path tmp = fs::path(trial_dir()) / "tmp_ckpt";
    fs::create_directories(tmp);
    std::ofstream(tmp / "state") << it << "\n";
    report({{"score", q * config.at("lr").get<double>() * it}}, tmp.string());
  }
}

// PBT with more trials than GPUs (4 trials of 1 GPU, 2 declared; CPUs for 4): a trial PBT pauses
// gives its GPU back and the waiting ones start on it; a paused trial runs again on whichever is
// free. Every run sees one GPU, and runs that overlap never share one.
TEST(TuneGpus, PbtPausesReleaseTheirGpus) {
  const fs::path dir = fresh_dir("gpus-pbt");
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  fs::create_directories(dir / "runs");
  auto pbt = std::make_shared<PbtScheduler>(
      PbtOptions{.time_attr = "training_iteration",
                 .perturbation_interval = 2,
                 .hyperparam_mutations = Config{{"lr", Config::array({0.5, 1.0, 1.5})}}});
  Tuner tuner(
      pbt_gpu_trainable,
      Config{
          {"q", grid_search({0.1, 0.5, 0.9, 1.3})}, {"lr", 1.0}, {"runs", (dir / "runs").string()}},
      {.metric = "score",
       .mode = "max",
       .scheduler = pbt,
       .num_cpus = 4,
       .num_gpus = 2,
       .trial_resources = {.gpus = 1},
       .storage_path = (dir / "storage").string(),
       .seed = 5,
       .verbose = false});
  const ResultGrid grid = tuner.fit();
  ASSERT_EQ(grid.size(), 4u);
  for (const auto& t : grid.trials()) {
    EXPECT_EQ(t.status, TrialStatus::Terminated) << t.id << ": " << t.error;
    EXPECT_EQ(t.last_result.value("training_iteration", Config(0)), 8) << t.id;
  }
  std::vector<Config> runs;
  for (const auto& e : fs::directory_iterator(dir / "runs")) {
    std::ifstream in(e.path());
    runs.push_back(Config::parse(in));
  }
  EXPECT_GT(runs.size(), 4u) << "no trial was paused and run again";
  for (const auto& r : runs) {
    EXPECT_TRUE(r.at("cvd") == "0" || r.at("cvd") == "1") << r.dump();
    for (const auto& other : runs) {
      if (&other == &r) continue;
      const bool overlap = r.at("start").get<double>() < other.at("end").get<double>() &&
                           other.at("start").get<double>() < r.at("end").get<double>();
      if (overlap) {
        EXPECT_NE(r.at("cvd"), other.at("cvd")) << r.dump() << " " << other.dump();
      }
    }
  }
  EXPECT_LE(most_at_once(runs), 2);
  EXPECT_GT(pbt->num_perturbations(), 0);
  fs::remove_all(dir);
}

// The pool alone, as Ray's raylet allocates (ResourceInstanceSet::TryAllocate).
TEST(TuneGpus, PoolAllocatesAsRaysRaylet) {
  using Ids = std::vector<int>;
  GpuPool p(2);
  auto take = [&](double g) {
    auto a = p.acquire(gpu_units(g));
    return a ? std::optional<GpuPool::Allocation>(*a) : std::nullopt;
  };
  // Fractions: the best fit, the lowest id on a tie.
  auto a = take(0.5), b = take(0.5), c = take(0.5);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(GpuPool::ids(*a), Ids{0});
  EXPECT_EQ(GpuPool::ids(*b), Ids{0});
  EXPECT_EQ(GpuPool::ids(*c), Ids{1});
  EXPECT_FALSE(take(1)) << "no whole GPU is free";
  p.release(*a);
  auto d = take(0.5);
  EXPECT_EQ(GpuPool::ids(*d), Ids{0}) << "tie between two halves: the lowest id";
  p.release(*b), p.release(*c), p.release(*d);
  // 0.3 three times leaves 0.1 exactly (units, not floating point): a fourth 0.1 fits.
  auto t1 = take(0.3), t2 = take(0.3), t3 = take(0.3), t4 = take(0.1);
  for (auto* t : {&t1, &t2, &t3, &t4}) EXPECT_EQ(GpuPool::ids(**t), Ids{0});
  for (auto* t : {&t1, &t2, &t3, &t4}) p.release(**t);
  // Whole ones first, lowest free id; then the fraction's best fit.
  GpuPool q(3);
  auto h = q.acquire(gpu_units(0.5));
  auto w = q.acquire(gpu_units(2));
  auto h2 = q.acquire(gpu_units(0.25));
  ASSERT_TRUE(h && w && h2);
  EXPECT_EQ(GpuPool::ids(*h), Ids{0});
  EXPECT_EQ(GpuPool::ids(*w), (Ids{1, 2})) << "the whole ones free, lowest first";
  EXPECT_EQ(GpuPool::ids(*h2), Ids{0}) << "the fraction's best fit";
  EXPECT_FALSE(q.acquire(gpu_units(1))) << "no whole GPU left";
  EXPECT_FALSE(GpuPool(1).acquire(gpu_units(2)));
  // The driver's list names the ids; one past its end gives the whole list, as Ray's worker.
  EXPECT_EQ(GpuPool::visible_devices({0, 1}, std::nullopt), "0,1");
  EXPECT_EQ(GpuPool::visible_devices({1}, std::string("3,5")), "5");
  EXPECT_EQ(GpuPool::visible_devices({2}, std::string("3,5")), "3,5");
  EXPECT_EQ(GpuPool::visible_devices({0}, std::string("")), "");
}

// Requests that cannot be met: clear errors, at construction or at fit().
TEST(TuneGpus, ImpossibleRequestsAreUsageErrors) {
  const fs::path dir = fresh_dir("gpus-errors");
  auto options = [&](double gpus, int num_gpus) {
    TuneOptions o;
    o.trial_resources.gpus = gpus;
    o.num_gpus = num_gpus;
    o.storage_path = dir.string();
    o.verbose = false;
    return o;
  };
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const dtrain::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no UsageError)");
  };
  const Config space = {{"i", grid_search({0})}, {"dir", dir.string()}};
  EXPECT_NE(message([&] { Tuner(gpu_trainable, space, options(-1, 2)); }).find(">= 0"),
            std::string::npos);
  EXPECT_NE(message([&] { Tuner(gpu_trainable, space, options(0.00001, 2)); }).find("0.0001"),
            std::string::npos);
  // 1.5: Ray fails the trial ("GPU resource quantities >1 must be whole numbers"); dtrain at once.
  EXPECT_NE(message([&] { Tuner(gpu_trainable, space, options(1.5, 2)); }).find("whole number"),
            std::string::npos);
  EXPECT_NE(message([&] { Tuner(gpu_trainable, space, options(1, -2)); }).find("num_gpus"),
            std::string::npos);
  // More than declared: at fit(), before any trial starts (Ray would wait forever).
  const std::string more = message([&] { Tuner(gpu_trainable, space, options(3, 2)).fit(); });
  EXPECT_NE(more.find("has 2 GPU(s)"), std::string::npos) << more;
  EXPECT_FALSE(fs::exists(dir / "tune" / "tuner_state.json")) << "nothing ran";
  // A cluster engine that places no GPUs, and num_gpus on a cluster.
  TuneOptions ssh = options(1, -1);
  ssh.local_mode = false;
  ssh.cluster.engine = "ssh";
  ssh.cluster.hosts = {"127.0.0.1"};
  const std::string on_ssh = message([&] { Tuner(gpu_trainable, space, ssh); });
  EXPECT_NE(on_ssh.find("local mode"), std::string::npos) << on_ssh;
  ssh.trial_resources.gpus = 0;
  ssh.num_gpus = 2;
  EXPECT_NE(message([&] { Tuner(gpu_trainable, space, ssh); }).find("num_gpus is for a local"),
            std::string::npos);
  // An int still sets it (the field was an int).
  const int n = 1;
  TrialResources r{.processes = 1, .gpus = n};
  EXPECT_EQ(r.gpus, 1.0);
  fs::remove_all(dir);
}

int main(int argc, char** argv) {
  dtrain::init(argc, argv);  // a trial's worker runs its trainable here and exits
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
