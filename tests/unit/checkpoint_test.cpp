// Checkpoints: round trip of model, Adam state, training state, metadata and RNG; mismatch
// and missing-file errors; atomic writes when a save fails or the process dies mid-write;
// rank gating; bitwise-exact resume; latest_checkpoint().
#include "dtrain/checkpoint.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <sstream>
#include <type_traits>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "dtrain/error.h"
#include "support/scoped_env.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dtrain_ckpt_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

// Parameters and buffers of every kind a checkpoint must carry: weights, biases, an undefined
// bias (Linear without bias registers one), BatchNorm's running stats and its int64
// num_batches_tracked, and a Dropout that draws from the RNG.
struct NetImpl : torch::nn::Module {
  NetImpl(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    bn = register_module("bn", torch::nn::BatchNorm1d(hidden));
    drop = register_module("drop", torch::nn::Dropout(0.3));
    fc2 = register_module("fc2",
                          torch::nn::Linear(torch::nn::LinearOptions(hidden, out).bias(false)));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(drop(torch::relu(bn(fc1(x))))); }
  torch::nn::Linear fc1{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::Linear fc2{nullptr};
};
TORCH_MODULE(Net);

constexpr int64_t kIn = 8;
constexpr int64_t kOut = 3;

// Steps on data drawn from the default generator, so the run depends on the RNG state.
void train(Net& net, torch::optim::Optimizer& opt, int steps) {
  net->train();
  for (int i = 0; i < steps; ++i) {
    torch::Tensor x = torch::randn({16, kIn});
    torch::Tensor y = torch::randn({16, kOut});
    opt.zero_grad();
    torch::Tensor loss = torch::mse_loss(net->forward(x), y);
    loss.backward();
    opt.step();
  }
}

// Every parameter and buffer bitwise equal (names in model order; both models share a layout).
::testing::AssertionResult same_tensors(torch::nn::Module& a, torch::nn::Module& b) {
  auto check =
      [](const torch::OrderedDict<std::string, torch::Tensor>& x,
         const torch::OrderedDict<std::string, torch::Tensor>& y) -> ::testing::AssertionResult {
    if (x.size() != y.size()) return ::testing::AssertionFailure() << "different tensor counts";
    for (size_t i = 0; i < x.size(); ++i) {
      const auto& tx = x[x.keys()[i]];
      const auto& ty = y[y.keys()[i]];
      if (tx.defined() != ty.defined() || (tx.defined() && !torch::equal(tx, ty))) {
        return ::testing::AssertionFailure() << "'" << x.keys()[i] << "' differs";
      }
    }
    return ::testing::AssertionSuccess();
  };
  auto p = check(a.named_parameters(), b.named_parameters());
  if (!p) return p;
  return check(a.named_buffers(), b.named_buffers());
}

// A template, so that only the branch of this libtorch's key type is compiled.
template <typename Optimizer>
torch::optim::AdamParamState& adam_state(Optimizer& opt, const torch::Tensor& param) {
  // The state's key is the parameter's TensorImpl: as text in libtorch 1.13, the pointer in 2.x.
  auto& state = opt.state();
  using Key = typename std::decay_t<decltype(state)>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream key;
    key << param.unsafeGetTensorImpl();
    return static_cast<torch::optim::AdamParamState&>(*state.at(key.str()));
  } else {
    return static_cast<torch::optim::AdamParamState&>(*state.at(param.unsafeGetTensorImpl()));
  }
}

SaveOptions single_process() {
  SaveOptions o;
  o.rank = 0;
  return o;
}

// LoadOptions::load_rng = false: the generator keeps the state it had before the load.
void check_load_rng_false_leaves_the_generator_alone() {
  TempDir dir;
  const std::string path = dir.file("ckpt_1.pt");
  Net a(kIn, 4, kOut);
  torch::manual_seed(5);
  ASSERT_TRUE(save_checkpoint(path, *a, nullptr, {}, single_process()));
  torch::manual_seed(6);
  torch::Tensor expected = torch::rand({4});
  torch::manual_seed(6);
  LoadOptions lo;
  lo.load_rng = false;
  load_checkpoint(path, *a, nullptr, lo);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected));
}

TEST(CheckpointTest, RoundTripsModelOptimizerStateMetadataAndRng) {
  TempDir dir;
  const std::string path = dir.file("ckpt_3.pt");
  torch::manual_seed(1);
  Net a(kIn, 16, kOut);
  torch::optim::Adam opt_a(a->parameters(), torch::optim::AdamOptions(1e-2));
  train(a, opt_a, 3);

  TrainingState state;
  state.step = 3;
  state.epoch = 1;
  state.sampler_epoch = 4;
  state.batch_in_epoch = 2;
  state.metadata = {
      {"config", R"({"lr": 0.01, "hidden": 16})"}, {"note", "ünïcode \"quoted\"\n"}, {"empty", ""}};
  ASSERT_TRUE(save_checkpoint(path, *a, &opt_a, state, single_process()));
  ASSERT_TRUE(fs::is_regular_file(path));
  EXPECT_EQ(dir.names(), std::vector<std::string>{"ckpt_3.pt"}) << "the temp file must be gone";
  torch::Tensor next_draw = torch::rand({5});  // what the RNG gives right after the save

  torch::manual_seed(2);
  Net b(kIn, 16, kOut);
  torch::optim::Adam opt_b(b->parameters(), torch::optim::AdamOptions(0.5));
  ASSERT_FALSE(same_tensors(*a, *b)) << "the fresh model must start different";
  TrainingState loaded = load_checkpoint(path, *b, &opt_b);

  EXPECT_EQ(loaded.step, 3);
  EXPECT_EQ(loaded.epoch, 1);
  EXPECT_EQ(loaded.sampler_epoch, 4);
  EXPECT_EQ(loaded.batch_in_epoch, 2);
  EXPECT_EQ(loaded.metadata, state.metadata);
  EXPECT_TRUE(same_tensors(*a, *b));
  EXPECT_EQ(b->bn->num_batches_tracked.item<int64_t>(), 3);
  EXPECT_FALSE(b->fc2->bias.defined());

  // Adam's per-parameter state and its options came back.
  auto pa = a->parameters();
  auto pb = b->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    auto& sa = adam_state(opt_a, pa[i]);
    auto& sb = adam_state(opt_b, pb[i]);
    EXPECT_EQ(sa.step(), sb.step());
    EXPECT_TRUE(torch::equal(sa.exp_avg(), sb.exp_avg())) << "exp_avg of parameter " << i;
    EXPECT_TRUE(torch::equal(sa.exp_avg_sq(), sb.exp_avg_sq())) << "exp_avg_sq of parameter " << i;
  }
  auto& options = static_cast<torch::optim::AdamOptions&>(opt_b.param_groups()[0].options());
  EXPECT_DOUBLE_EQ(options.lr(), 1e-2);

  // The CPU generator is where it was at the save.
  EXPECT_TRUE(torch::equal(torch::rand({5}), next_draw));

  check_load_rng_false_leaves_the_generator_alone();
}

TEST(CheckpointTest, MismatchedModelNamesTheParameterAndChangesNothing) {
  TempDir dir;
  const std::string path = dir.file("ckpt_1.pt");
  Net saved(kIn, 16, kOut);
  ASSERT_TRUE(save_checkpoint(path, *saved, nullptr, {}, single_process()));

  Net wider(kIn, 12, kOut);
  Net before(kIn, 12, kOut);
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < wider->parameters().size(); ++i)
      before->parameters()[i].copy_(wider->parameters()[i]);
  }
  try {
    load_checkpoint(path, *wider, nullptr);
    FAIL() << "a model of another shape was loaded";
  } catch (const UsageError& e) {
    FAIL() << "a shape mismatch is an Error, not a UsageError: " << e.what();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'fc1.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[16, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[12, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
  }
  EXPECT_TRUE(same_tensors(*wider, *before)) << "a failed load must not change the model";

  // Other names: a parameter the checkpoint lacks, and one the model lacks.
  torch::nn::Sequential seq(torch::nn::Linear(kIn, 16));
  try {
    load_checkpoint(path, *seq, nullptr);
    FAIL() << "a model with other parameter names was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'0.weight' is missing"), std::string::npos) << e.what();
  }
  struct Bigger : NetImpl {
    Bigger() : NetImpl(kIn, 16, kOut) { register_parameter("extra", torch::zeros({2})); }
  } bigger;
  EXPECT_THROW(
      {
        try {
          load_checkpoint(path, bigger, nullptr);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("'extra' is missing"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  struct Smaller : torch::nn::Module {
    Smaller() {
      register_module("fc1", torch::nn::Linear(kIn, 16));
      register_module("bn", torch::nn::BatchNorm1d(16));
    }
  } smaller;
  try {
    load_checkpoint(path, smaller, nullptr);
    FAIL() << "a checkpoint with more parameters than the model was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc2.weight' that the model does not have"),
              std::string::npos)
        << e.what();
  }
}

void check_missing_path_is_a_usage_error_naming_it() {
  TempDir dir;
  const std::string path = dir.file("nope/ckpt_9.pt");
  Net net(kIn, 4, kOut);
  try {
    load_checkpoint(path, *net, nullptr);
    FAIL() << "loading a missing file succeeded";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

void check_other_files_are_not_checkpoints() {
  TempDir dir;
  Net net(kIn, 4, kOut);
  const std::string garbage = dir.file("garbage.pt");
  std::ofstream(garbage) << "not a zip archive at all";
  const std::string tensor = dir.file("tensor.pt");
  torch::save(torch::ones({3}), tensor);  // a torch archive, but not ours
  for (const auto& p : {garbage, tensor}) {
    try {
      load_checkpoint(p, *net, nullptr);
      FAIL() << p << " was loaded";
    } catch (const UsageError& e) {
      FAIL() << "an existing non-checkpoint is an Error, not a UsageError: " << e.what();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not a dtrain checkpoint"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
}

void check_optimizer_state_is_required_when_an_optimizer_is_given() {
  TempDir dir;
  const std::string path = dir.file("ckpt_1.pt");
  Net net(kIn, 4, kOut);
  ASSERT_TRUE(save_checkpoint(path, *net, nullptr, {}, single_process()));
  torch::optim::Adam opt(net->parameters());
  try {
    load_checkpoint(path, *net, &opt);
    FAIL() << "a checkpoint without optimizer state filled an optimizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no optimizer state"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(load_checkpoint(path, *net, nullptr));
}

void check_unwritable_directory_is_an_error_with_path_and_errno() {
  TempDir dir;
  const std::string path = dir.file("missing_dir/ckpt_1.pt");
  Net net(kIn, 4, kOut);
  try {
    save_checkpoint(path, *net, nullptr, {}, single_process());
    FAIL() << "saved into a directory that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOENT)), std::string::npos) << e.what();
  }
}

// The error cases share one process: every test process pays libtorch's ~0.6 s of loading.
TEST(CheckpointTest, ErrorsNameThePathAndTheCause) {
  check_missing_path_is_a_usage_error_naming_it();
  check_other_files_are_not_checkpoints();
  check_optimizer_state_is_required_when_an_optimizer_is_given();
  check_unwritable_directory_is_an_error_with_path_and_errno();
}

// Lowers RLIMIT_FSIZE for this process so a write past `bytes` fails (EFBIG with SIGXFSZ
// ignored, or death by SIGXFSZ by default): a deterministic way to break a save midway.
// Works for root too, unlike read-only permissions.
void limit_file_size(rlim_t bytes) {
  rlimit lim{};
  ::getrlimit(RLIMIT_FSIZE, &lim);
  lim.rlim_cur = bytes;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
}

void check_failed_save_keeps_the_previous_checkpoint_and_leaves_no_temp() {
  TempDir dir;
  const std::string path = dir.file("ckpt_5.pt");
  torch::manual_seed(11);
  Net good(kIn, 64, kOut);
  ASSERT_TRUE(save_checkpoint(path, *good, nullptr, {}, single_process()));
  ASSERT_GT(fs::file_size(path), 8192u);

  torch::manual_seed(12);
  Net newer(kIn, 64, kOut);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  limit_file_size(4096);
  std::string error;
  try {
    save_checkpoint(path, *newer, nullptr, {}, single_process());
  } catch (const Error& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(error.find(std::strerror(EFBIG)), std::string::npos)
      << "expected a write error, got: " << error;
  EXPECT_NE(error.find(path), std::string::npos) << error;

  EXPECT_EQ(dir.names(), std::vector<std::string>{"ckpt_5.pt"}) << "the temp file must be removed";
  Net check(kIn, 64, kOut);
  load_checkpoint(path, *check, nullptr);
  EXPECT_TRUE(same_tensors(*check, *good)) << "the previous checkpoint must be intact";
}

void check_crash_mid_save_keeps_the_previous_checkpoint() {
  TempDir dir;
  const std::string path = dir.file("ckpt_5.pt");
  torch::manual_seed(21);
  Net good(kIn, 64, kOut);
  ASSERT_TRUE(save_checkpoint(path, *good, nullptr, {}, single_process()));
  torch::manual_seed(22);
  Net newer(kIn, 64, kOut);
  const std::string newer_ckpt = dir.file("ckpt_7.pt");

  // The child dies by SIGXFSZ in the middle of writing its temp file (a kill at the worst
  // moment, made deterministic), overwriting ckpt_5.pt and, separately, creating ckpt_7.pt.
  for (const std::string& target : {path, newer_ckpt}) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::prctl(PR_SET_DUMPABLE, 0);  // no core file for the expected crash
      ::signal(SIGXFSZ, SIG_DFL);
      rlimit lim{};
      ::getrlimit(RLIMIT_FSIZE, &lim);
      lim.rlim_cur = 4096;
      ::setrlimit(RLIMIT_FSIZE, &lim);
      try {
        save_checkpoint(target, *newer, nullptr, {}, single_process());
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);  // reaching this means the crash did not happen
    }
    int status = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    pid_t done = 0;
    while ((done = ::waitpid(child, &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done == 0) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      FAIL() << "the saving child did not finish within 20 s";
    }
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ)
        << "the child should have died of SIGXFSZ mid-write; status " << status;
    const std::string tmp = target + ".tmp." + std::to_string(child);
    ASSERT_TRUE(fs::exists(tmp)) << "the crash should leave its partial temp file " << tmp;
    EXPECT_LE(fs::file_size(tmp), 4096u);
  }

  EXPECT_FALSE(fs::exists(newer_ckpt)) << "a crashed first save must not create the checkpoint";
  EXPECT_EQ(dir.names().size(), 3u);  // ckpt_5.pt and the two partial temp files
  // The partial files are never taken for checkpoints.
  EXPECT_EQ(latest_checkpoint(dir.str()), path);
  Net check(kIn, 64, kOut);
  load_checkpoint(path, *check, nullptr);
  EXPECT_TRUE(same_tensors(*check, *good)) << "the previous checkpoint must be intact";
}

TEST(CheckpointTest, SavesAreAtomic) {
  {
    SCOPED_TRACE("a save that fails with a write error");
    check_failed_save_keeps_the_previous_checkpoint_and_leaves_no_temp();
  }
  {
    SCOPED_TRACE("a save whose process dies mid-write");
    check_crash_mid_save_keeps_the_previous_checkpoint();
  }
}

using dtrain::test::ScopedEnv;

TEST(CheckpointTest, OnlyTheWriterRankWrites) {
  TempDir dir;
  Net net(kIn, 4, kOut);
  SaveOptions o;
  o.rank = 1;
  EXPECT_FALSE(save_checkpoint(dir.file("ckpt_1.pt"), *net, nullptr, {}, o));
  EXPECT_TRUE(dir.names().empty()) << "a non-writer rank must write nothing";

  o.writer_rank = 1;
  EXPECT_TRUE(save_checkpoint(dir.file("ckpt_2.pt"), *net, nullptr, {}, o));
  o.writer_rank = -1;  // every rank writes its own file
  o.rank = 3;
  EXPECT_TRUE(save_checkpoint(dir.file("ckpt_3.pt"), *net, nullptr, {}, o));
  EXPECT_EQ(dir.names(), (std::vector<std::string>{"ckpt_2.pt", "ckpt_3.pt"}));

  // Without an explicit rank (and no process group) the launcher's RANK decides.
  ScopedEnv env;
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  EXPECT_FALSE(save_checkpoint(dir.file("ckpt_4.pt"), *net, nullptr, {}));
  env.set("RANK", "0");
  EXPECT_TRUE(save_checkpoint(dir.file("ckpt_4.pt"), *net, nullptr, {}));
  EXPECT_EQ(dir.names().size(), 3u);
}

TEST(CheckpointTest, ResumeIsBitwiseEqualToAnUninterruptedRun) {
  constexpr int k = 6;
  constexpr int64_t hidden = 32;
  TempDir dir;
  const std::string path = dir.file("ckpt_6.pt");

  torch::manual_seed(0);
  Net reference(kIn, hidden, kOut);
  torch::optim::Adam reference_opt(reference->parameters(), torch::optim::AdamOptions(1e-2));
  train(reference, reference_opt, 2 * k);

  torch::manual_seed(0);
  Net first(kIn, hidden, kOut);
  torch::optim::Adam first_opt(first->parameters(), torch::optim::AdamOptions(1e-2));
  train(first, first_opt, k);
  TrainingState state;
  state.step = k;
  ASSERT_TRUE(save_checkpoint(path, *first, &first_opt, state, single_process()));
  ASSERT_FALSE(same_tensors(*first, *reference))
      << "the halves must differ, or the check proves nothing";

  // A new process would start from another RNG state, another init and default options.
  auto resume = [&](bool load_rng, Net& net) {
    torch::manual_seed(12345);
    net = Net(kIn, hidden, kOut);
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.1));
    LoadOptions lo;
    lo.load_rng = load_rng;
    TrainingState st = load_checkpoint(path, *net, &opt, lo);
    EXPECT_EQ(st.step, k);
    train(net, opt, k);
  };
  Net resumed(nullptr);
  resume(true, resumed);
  EXPECT_TRUE(same_tensors(*resumed, *reference))
      << "resume must reproduce the uninterrupted run bitwise";

  // The RNG state is what makes it exact: without it the data and dropout masks differ.
  Net without_rng(nullptr);
  resume(false, without_rng);
  EXPECT_FALSE(same_tensors(*without_rng, *reference));
}

// The keys in PyTorch's order. Expected: what torch 2.11's state_dict() lists for the same
// module in Python (nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4),
// nn.Sequential(nn.Linear(4, 2), nn.BatchNorm1d(2)), nn.Linear(2, 1))), printed there
// 2026-11-29; dtrain used to list every parameter before every buffer.
TEST(CheckpointTest, StateDictListsTheKeysInPyTorchsOrder) {
  // libtorch's Sequential cannot hold a Sequential: the same tree of named modules by hand.
  auto inner = std::make_shared<torch::nn::Module>();
  inner->register_module("0", torch::nn::Linear(4, 2));
  inner->register_module("1", torch::nn::BatchNorm1d(2));
  auto m = std::make_shared<torch::nn::Module>();
  m->register_module("0", torch::nn::Linear(3, 4));
  m->register_module("1", torch::nn::BatchNorm1d(4));
  m->register_module("2", inner);
  m->register_module("3", torch::nn::Linear(2, 1));
  std::vector<std::string> keys;
  for (const auto& item : state_dict(*m)) keys.push_back(item.key());
  const std::vector<std::string> pytorch = {"0.weight",
                                            "0.bias",
                                            "1.weight",
                                            "1.bias",
                                            "1.running_mean",
                                            "1.running_var",
                                            "1.num_batches_tracked",
                                            "2.0.weight",
                                            "2.0.bias",
                                            "2.1.weight",
                                            "2.1.bias",
                                            "2.1.running_mean",
                                            "2.1.running_var",
                                            "2.1.num_batches_tracked",
                                            "3.weight",
                                            "3.bias"};
  EXPECT_EQ(keys, pytorch);
}

TEST(CheckpointTest, LoadStateDictThatDoesNotFitNamesTheKeyAndChangesNothing) {
  torch::manual_seed(1);
  torch::nn::Sequential source(torch::nn::Linear(3, 4), torch::nn::Linear(4, 2));
  torch::nn::Sequential target(torch::nn::Linear(3, 4), torch::nn::Linear(4, 2));
  const auto before = state_dict(*target);
  std::vector<torch::Tensor> kept;
  for (const auto& item : before) kept.push_back(item.value().clone());
  auto expect_unchanged = [&] {
    size_t k = 0;
    for (const auto& item : state_dict(*target))
      EXPECT_TRUE(torch::equal(item.value(), kept[k++])) << item.key();
  };
  // Each misfit sits after entries that fit ("0.weight" comes first): none of them is copied.
  auto missing = state_dict(*source);
  missing.erase("1.bias");
  auto reshaped = state_dict(*source);
  reshaped["1.weight"] = torch::zeros({2, 5});
  auto extended = state_dict(*source);
  extended.insert("2.weight", torch::zeros({1}));
  const std::pair<StateDict*, std::string> cases[] = {
      {&missing, "no entry '1.bias'"},
      {&reshaped, "'1.weight' has shape [2, 5] in the state dict but [2, 4] in the model"},
      {&extended, "an entry '2.weight' that the model does not"}};
  for (const auto& [dict, message] : cases) {
    try {
      load_state_dict(*target, *dict);
      ADD_FAILURE() << "no error for: " << message;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
    expect_unchanged();
  }
  load_state_dict(*target, state_dict(*source));
  EXPECT_TRUE(torch::equal(state_dict(*target)["0.weight"], state_dict(*source)["0.weight"]));
}

TEST(CheckpointTest, LatestCheckpointPicksTheLargestStep) {
  TempDir dir;
  EXPECT_EQ(latest_checkpoint(dir.str()), std::nullopt);
  EXPECT_EQ(latest_checkpoint(dir.file("does_not_exist")), std::nullopt);
  for (const char* name :
       {"ckpt_2.pt", "ckpt_10.pt", "ckpt_9.pt", "ckpt_10.pt.tmp.123", "ckpt_99.pt.tmp.5",
        "ckpt_x.pt", "ckpt_.pt", "ckpt_12.pth", "other_100.pt", "ckpt_-50.pt", "model-7.pt"}) {
    std::ofstream(dir.file(name)) << "x";
  }
  fs::create_directory(dir.file("ckpt_500.pt"));  // a directory is not a checkpoint
  EXPECT_EQ(latest_checkpoint(dir.str()), dir.file("ckpt_10.pt"));
  EXPECT_EQ(latest_checkpoint(dir.str(), "model-"), dir.file("model-7.pt"));
  EXPECT_EQ(latest_checkpoint(dir.str(), "other_"), dir.file("other_100.pt"));
  EXPECT_EQ(latest_checkpoint(dir.str(), "none_"), std::nullopt);
  // Numbers, not names: 10 beats 9 although "9" > "1" as text; leading zeros are fine.
  std::ofstream(dir.file("ckpt_0011.pt")) << "x";
  EXPECT_EQ(latest_checkpoint(dir.str()), dir.file("ckpt_0011.pt"));
}

}  // namespace
}  // namespace dtrain
