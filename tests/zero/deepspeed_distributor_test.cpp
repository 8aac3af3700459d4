// DeepSpeedDistributor end to end: this test binary is the driver and (re-executed by the
// launcher) its own workers; a program gets --deepspeed --deepspeed_config PATH after its own
// arguments, as under Spark's DeepspeedTorchDistributor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dtrain/dtrain.h"
#include "launcher/subprocess.h"
#include "support/paths.h"

namespace {

nlohmann::json ds_config(int stage) {
  return {{"train_micro_batch_size_per_gpu", 4},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
          {"zero_optimization", {{"stage", stage}}}};
}

// Runs in the workers: trains with the config the distributor wrote; returns what it saw.
std::map<std::string, double> train_with_config() {
  auto path = dtrain::deepspeed_config_path();
  auto pg = dtrain::init_process_group();
  torch::manual_seed(5);
  auto model =
      torch::nn::Sequential(torch::nn::Linear(10, 7), torch::nn::Tanh(), torch::nn::Linear(7, 2));
  auto engine = dtrain::zero::initialize(model, path);
  torch::manual_seed(6);
  auto x = torch::randn({64, 10});
  auto y = (x.sum(1) > 0).to(torch::kLong);
  double first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    auto rows = x.narrow(0, (s % 8) * 8 + pg->rank() * 4, 4);
    auto loss = torch::nn::functional::cross_entropy(engine(rows),
                                                     y.narrow(0, (s % 8) * 8 + pg->rank() * 4, 4));
    engine.backward(loss);
    engine.step();
    if (s == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  return {{"world", double(pg->world_size())},
          {"stage", double(engine.config().zero.stage)},
          {"steps", double(engine.global_steps())},
          {"first_loss", first},
          {"last_loss", last}};
}

TEST(DeepSpeedDistributor, FunctionGetsTheConfigAndTrainsWithZero) {
  dtrain::DeepSpeedDistributor d({.num_gpus = 2, .deepspeed_config = ds_config(2)});
  auto path = d.config_path();
  EXPECT_TRUE(std::filesystem::exists(path));
  auto r = d.run(train_with_config);
  EXPECT_EQ(r["world"], 2);
  EXPECT_EQ(r["stage"], 2);
  EXPECT_EQ(r["steps"], 30);
  EXPECT_LT(r["last_loss"], r["first_loss"]);
}

TEST(DeepSpeedDistributor, ProgramGetsDeepSpeedFlags) {
  auto out = std::filesystem::temp_directory_path() /
             ("ds_program_" + std::to_string(::getpid()) + ".txt");
  std::string path;
  {
    dtrain::DeepSpeedDistributor d({.num_gpus = 2, .deepspeed_config = ds_config(3).dump()});
    path = d.config_path();
    d.run(DS_PROGRAM_BIN, {"--out", out.string()});
  }
  EXPECT_FALSE(std::filesystem::exists(path));  // the temporary config went with the distributor
  std::ifstream in(out);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "deepspeed=1 stage=3 world=2 steps=10") << line;
  std::filesystem::remove(out);
}

// A program's arguments as Spark's DeepspeedTorchDistributor (the venv's pyspark, run here in
// local mode) gives them, for a config given as an object, as a path and not at all: the
// program's own arguments, then `--deepspeed` and `--deepspeed_config PATH` - the user's path
// as given, or a file holding the object. torchrun's ${local_rank} is substituted on both.
TEST(DeepSpeedDistributor, ProgramArgumentsAsSparksDeepspeedTorchDistributor) {
  namespace fs = std::filesystem;
  const fs::path base = fs::temp_directory_path() / ("ds_argv_" + std::to_string(::getpid()));
  struct RemoveBase {  // also when an ASSERT below ends the test
    fs::path path;
    ~RemoveBase() { fs::remove_all(path); }
  } remove_base{base};
  fs::create_directories(base);
  const std::string config_path = (base / "ds.json").string();
  std::ofstream(config_path) << ds_config(2).dump() << "\n";
  const std::string script = std::string(DTRAIN_SOURCE_DIR) + "/tests/zero/ds_argv.py";
  const std::vector<std::string> args = {"--epochs", "1", "positional", "x${local_rank}"};
  std::vector<std::string> peer = {
      DTRAIN_VENV_PYTHON, std::string(DTRAIN_SOURCE_DIR) + "/tests/zero/ds_distributor_peer.py",
      (base / "spark").string(), script, config_path};
  peer.insert(peer.end(), args.begin(), args.end());
  std::string spark_home =
      dtrain::test::run_command({DTRAIN_VENV_PYTHON, "-c",
                                 "import os, pyspark; print(os.path.dirname(pyspark.__file__))"},
                                {.timeout = std::chrono::seconds(60)})
          .out;
  spark_home.erase(spark_home.find_last_not_of("\n") + 1);
  auto r = dtrain::test::run_command(
      peer,
      {.env = {"SPARK_HOME=" + spark_home, "PYSPARK_PYTHON=" + std::string(DTRAIN_VENV_PYTHON),
               "SPARK_LOCAL_IP=127.0.0.1"},
       .timeout = std::chrono::seconds(300)});
  ASSERT_EQ(r.exit_code, 0) << "Spark's DeepspeedTorchDistributor (needs java and the venv's "
                               "pyspark: scripts/setup.sh)\n"
                            << r.out << r.err;
  auto read = [](const fs::path& p) {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
  };
  for (const std::string c : {"object", "path", "none"}) {
    SCOPED_TRACE(c);
    const fs::path dir = base / "dtrain" / c;
    fs::create_directories(dir);
    ::setenv("DS_ARGV_OUT", dir.c_str(), 1);
    nlohmann::json config = c == "object" ? ds_config(2)
                            : c == "path" ? nlohmann::json(config_path)
                                          : nlohmann::json();
    dtrain::DeepSpeedDistributor d({.num_gpus = 2, .deepspeed_config = config});
    d.run(script, args);
    ::unsetenv("DS_ARGV_OUT");
    for (int rank = 0; rank < 2; ++rank) {
      const auto theirs = read(base / "spark" / c / (std::to_string(rank) + ".json"));
      const auto ours = read(dir / (std::to_string(rank) + ".json"));
      auto want = theirs.at("argv").get<std::vector<std::string>>();
      auto got = ours.at("argv").get<std::vector<std::string>>();
      ASSERT_EQ(got.size(), want.size()) << ours.dump() << " vs Spark's " << theirs.dump();
      // The temporary file's name is each one's own; what it holds is compared below.
      if (c == "object") got.back() = want.back();
      EXPECT_EQ(got, want) << "rank " << rank;
      EXPECT_EQ(ours.at("config"), theirs.at("config")) << "rank " << rank;
      // What was compared: Spark's order, and ${local_rank} substituted.
      EXPECT_EQ(want[3], "x" + std::to_string(rank));
      EXPECT_EQ(want[4], "--deepspeed");
      EXPECT_EQ(want.size(), c == "none" ? 5u : 7u);
      if (c == "path") EXPECT_EQ(want.back(), config_path);
      if (c != "none") EXPECT_EQ(theirs.at("config"), ds_config(2));
    }
  }
}

TEST(DeepSpeedDistributor, BadConfigFailsOnTheDriverNamingTheKey) {
  auto bad = ds_config(2);
  bad["zero_optimization"]["stage3_prefetch_bucket_sise"] = 1;
  try {
    dtrain::DeepSpeedDistributor d({.num_gpus = 2, .deepspeed_config = bad});
    ADD_FAILURE() << "no error";
  } catch (const dtrain::zero::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "zero_optimization.stage3_prefetch_bucket_sise: unknown key (DeepSpeed 0.19.8 "
              "refuses it too); did you mean stage3_prefetch_bucket_size?");
  }
  // train_batch_size checked against num_gpus * nnodes.
  auto wrong = ds_config(1);
  wrong["train_batch_size"] = 12;
  EXPECT_THROW(dtrain::DeepSpeedDistributor({.num_gpus = 2, .deepspeed_config = wrong}),
               dtrain::zero::ConfigError);
  EXPECT_THROW(
      dtrain::DeepSpeedDistributor({.num_gpus = 2, .nnodes = 2, .deepspeed_config = ds_config(1)}),
      dtrain::UsageError);
  // None of the failed constructions leaves its config directory behind (the last one threw
  // after the directory was made, while the distributor was being set up).
  const std::string mine = "dtrain-deepspeed-" + std::to_string(::getpid()) + "-";
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::temp_directory_path()))
    EXPECT_NE(e.path().filename().string().rfind(mine, 0), 0u) << e.path() << " was left behind";
}

}  // namespace

int main(int argc, char** argv) {
  dtrain::init(argc, argv);  // a worker runs its function here and exits
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
