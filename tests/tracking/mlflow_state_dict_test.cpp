// dtrain::mlflow state dicts (dtrain/mlflow_pytorch.h) against a real `mlflow server` and the real
// Python peer: PyPI's mlflow.pytorch.log_state_dict / load_state_dict and torch.nn models
// (tests/tracking/state_dict_peer.py, in the venv of pinned peers). One server for the binary,
// started on a free loopback port with a sqlite backend and proxied artifacts in a temporary
// directory; CTest runs the binary as one test. It runs on both libtorch trees: what C++ writes
// and reads is libtorch's tensors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "dtrain/error.h"
#include "dtrain/mlflow_pytorch.h"
#include "dtrain/sync_batch_norm.h"
#include "support/paths.h"
#include "support/scoped_env.h"
#include "tracking/support.h"
#include "zero/pickle.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dtrain::test::MlflowServer;
using dtrain::test::run_command;
namespace mlflow = dtrain::mlflow;
namespace pickle = dtrain::zero::detail;

namespace {

dtrain::test::MlflowServerEnvironment* const g_env =
    dtrain::test::MlflowServerEnvironment::add("dtrain_mlflow_sd_");

// examples/fashion_mnist/main.cpp's make_model, as the example builds it.
torch::nn::Sequential make_model(const std::string& kind) {
  using namespace torch::nn;
  if (kind == "mlp") {
    return Sequential(Flatten(), Linear(784, 512), ReLU(), Linear(512, 256), ReLU(),
                      Linear(256, 10));
  }
  return Sequential(Conv2d(Conv2dOptions(1, 32, 3).padding(1)), dtrain::SyncBatchNorm(32), ReLU(),
                    MaxPool2d(2), Conv2d(Conv2dOptions(32, 64, 3).padding(1)),
                    dtrain::SyncBatchNorm(64), ReLU(), MaxPool2d(2), Flatten(),
                    Linear(64 * 7 * 7, 128), ReLU(), Linear(128, 10));
}

// Buffers other than their initial values, so a lost buffer shows in the outputs.
void vary_buffers(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& b : m.named_buffers()) {
    if (b.key().find("running_mean") != std::string::npos) b.value().uniform_(-0.5, 0.5);
    if (b.key().find("running_var") != std::string::npos) b.value().uniform_(0.5, 1.5);
    if (b.key().find("num_batches_tracked") != std::string::npos) b.value().fill_(5);
  }
}

std::vector<std::string> keys_of(const dtrain::StateDict& sd) { return sd.keys(); }

std::vector<std::string> json_strings(const nlohmann::json& j) {
  std::vector<std::string> out;
  for (const auto& s : j) out.push_back(s.get<std::string>());
  return out;
}

void write_file(const fs::path& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs state_dict_peer.py; the JSON of its last line, or a failure of the test.
nlohmann::json peer(const std::vector<std::string>& args) {
  std::vector<std::string> argv{
      DTRAIN_VENV_PYTHON, std::string(DTRAIN_SOURCE_DIR) + "/tests/tracking/state_dict_peer.py"};
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_command(argv, {.env = {"MLFLOW_TRACKING_URI=" + g_env->server->url(),
                                      "MLFLOW_ALLOW_PICKLE_DESERIALIZATION=true"},
                              .timeout = 300s});
  if (r.exit_code != 0) {
    ADD_FAILURE() << "state_dict_peer.py failed (" << r.exit_code << "): " << r.out << r.err;
    return nlohmann::json::object();
  }
  auto last = r.out.rfind("\n{");
  return nlohmann::json::parse(last == std::string::npos ? r.out : r.out.substr(last + 1));
}

// A UsageError of one line holding each of `parts`.
void expect_one_line_error(const std::function<void()>& f, const std::vector<std::string>& parts);

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dtrain::UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a UsageError: ") + e.what();
  }
  return "no error";
}

void expect_one_line_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  const std::string what = error_of(f);
  EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  EXPECT_EQ(what.find("not a UsageError"), std::string::npos) << what;
  EXPECT_NE(what, "no error");
  for (const auto& p : parts) EXPECT_NE(what.find(p), std::string::npos) << p << " in: " << what;
}

TEST(MlflowStateDict, CppLogsAndPythonsLoadStateDictStrictlyLoadsItIntoTheTorchNnModel) {
  ASSERT_EQ(g_env->error, "");  // fail, never skip, without a server
  torch::manual_seed(3);
  auto model = make_model("cnn");
  vary_buffers(*model);
  model->eval();
  const auto input = torch::randn({4, 1, 28, 28});
  const auto output = model->forward(input);
  auto io = pickle::py_dict();
  pickle::py_set(io, "input", pickle::py_tensor(input));
  pickle::py_set(io, "output", pickle::py_tensor(output.detach()));
  write_file(g_env->dir / "cpp_io.pt", pickle::torch_save(*io));

  auto run = mlflow::Run::start({.tracking_uri = g_env->server->url(), .experiment = "cpp_logs"});
  ASSERT_TRUE(run.active());
  mlflow::log_state_dict(run, *model, "state_dict");
  const std::string id = run.id();
  run.end();

  auto got = peer({"check", "runs:/" + id + "/state_dict", "cnn",
                   (g_env->dir / "cpp_io.pt").string(), (g_env->dir / "echo.pt").string()});
  const auto cpp = dtrain::state_dict(*model);
  // The C++ example's model has the keys of the same model written with torch.nn, in its order.
  EXPECT_EQ(json_strings(got["python_keys"]), keys_of(cpp));
  EXPECT_EQ(json_strings(got["keys"]), keys_of(cpp));
  EXPECT_EQ(got["type"], "OrderedDict");
  EXPECT_EQ(got["missing"].size(), 0u) << got.dump();
  EXPECT_EQ(got["unexpected"].size(), 0u) << got.dump();
  EXPECT_EQ(got["dtypes"]["1.num_batches_tracked"], "torch.int64");
  EXPECT_EQ(got["dtypes"]["0.weight"], "torch.float32");
  EXPECT_EQ(got["shapes"]["9.weight"], nlohmann::json({128, 3136}));
  // The same outputs on the same input: equal on libtorch 2.11 (the peer's), within float
  // rounding on 1.13 (other kernels).
  EXPECT_LT(got["max_abs_diff"].get<double>(), 1e-5) << got.dump();
  // What Python loaded, saved again by Python's own torch.save: every tensor equal to the
  // module's (dtype, shape, values).
  auto echo = pickle::torch_load(read_bytes(g_env->dir / "echo.pt"), "echo.pt");
  ASSERT_EQ(echo->dict.size(), cpp.size());
  for (const auto& item : cpp) {
    const auto* t = echo->get(item.key());
    ASSERT_NE(t, nullptr) << item.key();
    EXPECT_EQ(t->tensor.scalar_type(), item.value().scalar_type()) << item.key();
    EXPECT_TRUE(torch::equal(t->tensor, item.value())) << item.key();
  }
}

TEST(MlflowStateDict, PythonsLogStateDictLoadsIntoTheCppModelWithEqualTensorsAndOutputs) {
  ASSERT_EQ(g_env->error, "");
  dtrain::test::ScopedEnv env;
  env.set("MLFLOW_TRACKING_URI", g_env->server->url().c_str());
  auto got = peer({"log", "python_logs", "cnn", (g_env->dir / "py_io.pt").string()});
  ASSERT_TRUE(got.contains("run_id")) << got.dump();
  const std::string id = got["run_id"];

  // The module's own state dict through runs:/, into the C++ example's model.
  torch::manual_seed(99);
  auto model = make_model("cnn");
  mlflow::load_state_dict(*model, "runs:/" + id + "/model");
  model->eval();
  auto io = pickle::torch_load(read_bytes(g_env->dir / "py_io.pt"), "py_io.pt");
  const auto out = model->forward(io->get("input")->tensor);
  EXPECT_LT((out - io->get("output")->tensor).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(model->named_buffers()["1.num_batches_tracked"].item<int64_t>(), 11);

  // The same artifact by the URI mlflow.get_artifact_uri gives (mlflow-artifacts:/...), and by
  // that URI with the server's address in it.
  const std::string artifact_uri = got["model_uri"];
  ASSERT_EQ(artifact_uri.rfind("mlflow-artifacts:/", 0), 0u) << artifact_uri;
  const auto by_runs = mlflow::load_state_dict("runs:/" + id + "/model");
  const auto by_proxy = mlflow::load_state_dict(artifact_uri);
  const auto by_host = mlflow::load_state_dict(
      "mlflow-artifacts://127.0.0.1:" + std::to_string(g_env->server->port()) +
          artifact_uri.substr(std::string("mlflow-artifacts:").size()),
      {.tracking_uri = "file:/nowhere"});  // the host in the URI wins
  ASSERT_EQ(by_runs.size(), model->named_parameters().size() + model->named_buffers().size());
  for (const auto& item : by_runs) {
    EXPECT_TRUE(torch::equal(item.value(), by_proxy[item.key()])) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), by_host[item.key()])) << item.key();
  }

  // Views, non-contiguous tensors, shared storages and dtypes as Python saved them.
  const auto tensors = mlflow::load_state_dict("runs:/" + id + "/tensors");
  const std::map<std::string, torch::Dtype> dtypes{
      {"torch.float32", torch::kFloat32}, {"torch.float64", torch::kFloat64},
      {"torch.float16", torch::kFloat16}, {"torch.bfloat16", torch::kBFloat16},
      {"torch.int64", torch::kInt64},     {"torch.int8", torch::kInt8},
      {"torch.bool", torch::kBool}};
  ASSERT_EQ(tensors.size(), got["tensors"].size());
  for (const auto& [key, want] : got["tensors"].items()) {
    const torch::Tensor* t = tensors.find(key);
    ASSERT_NE(t, nullptr) << key;
    EXPECT_EQ(t->scalar_type(), dtypes.at(want["dtype"].get<std::string>())) << key;
    EXPECT_EQ(t->sizes().vec(), want["shape"].get<std::vector<int64_t>>()) << key;
    const auto values = t->to(torch::kFloat64).contiguous();
    const auto expected = want["values"].get<std::vector<double>>();
    ASSERT_EQ(values.numel(), static_cast<int64_t>(expected.size())) << key;
    for (int64_t k = 0; k < values.numel(); ++k)
      EXPECT_EQ(values.data_ptr<double>()[k], expected[static_cast<size_t>(k)])
          << key << "[" << k << "]";
  }
  EXPECT_EQ(tensors["transposed"].strides().vec(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(tensors["window"].storage_offset(), 5);
  // One storage behind window, strided and matrix, as in Python.
  EXPECT_TRUE(tensors["window"].storage().is_alias_of(tensors["matrix"].storage()));
  EXPECT_TRUE(tensors["strided"].storage().is_alias_of(tensors["matrix"].storage()));
}

TEST(MlflowStateDict, BadInputsAreOneLineErrorsNamingWhatWasWrong) {
  ASSERT_EQ(g_env->error, "");
  dtrain::test::ScopedEnv env;
  env.set("MLFLOW_TRACKING_URI", g_env->server->url().c_str());
  auto run = mlflow::Run::start({.experiment = "bad_inputs"});
  ASSERT_TRUE(run.active());
  auto model = make_model("mlp");
  mlflow::log_state_dict(run, *model, "weights");
  // Not a state dict: a text file under the name, and a torch.save of a checkpoint dict.
  const fs::path text_dir = g_env->dir / "text";
  fs::create_directories(text_dir);
  std::ofstream(text_dir / "state_dict.pth") << "not a zip\n";
  run.log_artifact((text_dir / "state_dict.pth").string(), "text");
  auto checkpoint = pickle::py_dict();
  pickle::py_set(checkpoint, "epoch", pickle::py_int(3));
  const fs::path ckpt_dir = g_env->dir / "ckpt";
  fs::create_directories(ckpt_dir);
  write_file(ckpt_dir / "state_dict.pth", pickle::torch_save(*checkpoint));
  run.log_artifact((ckpt_dir / "state_dict.pth").string(), "checkpoint");
  // A state dict without one key, one with a tensor of another shape, one with a key more.
  auto partial = dtrain::state_dict(*model);
  partial.erase("3.bias");
  mlflow::log_state_dict(run, partial, "partial");
  auto reshaped = dtrain::state_dict(*model);
  reshaped["5.weight"] = torch::zeros({10, 7});
  mlflow::log_state_dict(run, reshaped, "reshaped");
  auto extended = dtrain::state_dict(*model);
  extended.insert("extra", torch::zeros({1}));
  mlflow::log_state_dict(run, extended, "extended");
  const std::string id = run.id();
  run.end();

  expect_one_line_error(
      [] { mlflow::load_state_dict("runs:/0123456789abcdef0123456789abcdef/weights"); },
      {"no run '0123456789abcdef0123456789abcdef'", g_env->server->url()});
  expect_one_line_error([&] { mlflow::load_state_dict("runs:/" + id + "/nothing_here"); },
                        {"no state_dict.pth", "nothing_here", "artifact path"});
  expect_one_line_error([&] { mlflow::load_state_dict("runs:/" + id + "/text"); },
                        {"text/state_dict.pth", "not a readable torch.save file"});
  expect_one_line_error([&] { mlflow::load_state_dict("runs:/" + id + "/checkpoint"); },
                        {"'epoch'", "is a int, not a tensor"});
  expect_one_line_error([] { mlflow::load_state_dict("s3://bucket/model"); },
                        {"s3://bucket/model", "scheme"});
  expect_one_line_error([&] { mlflow::load_state_dict(g_env->dir.string() + "/no_such_dir"); },
                        {"no state_dict.pth", "no_such_dir"});
  {
    dtrain::test::ScopedEnv no_uri;
    no_uri.set("MLFLOW_TRACKING_URI", nullptr);
    expect_one_line_error([&] { mlflow::load_state_dict("runs:/" + id + "/weights"); },
                          {"MLFLOW_TRACKING_URI"});
  }
  // Strict loading: the module keeps its values when the state dict does not fit.
  auto target = make_model("mlp");
  const auto before = dtrain::state_dict(*target)["1.weight"].clone();
  expect_one_line_error([&] { mlflow::load_state_dict(*target, "runs:/" + id + "/partial"); },
                        {"runs:/" + id + "/partial", "no entry '3.bias'"});
  expect_one_line_error(
      [&] { mlflow::load_state_dict(*target, "runs:/" + id + "/reshaped"); },
      {"'5.weight' has shape [10, 7] in the state dict but [10, 256] in the model"});
  expect_one_line_error([&] { mlflow::load_state_dict(*target, "runs:/" + id + "/extended"); },
                        {"an entry 'extra' that the model does not"});
  EXPECT_TRUE(torch::equal(dtrain::state_dict(*target)["1.weight"], before));
  // The whole one loads, from the server and from a local copy of the directory.
  mlflow::load_state_dict(*target, "runs:/" + id + "/weights");
  EXPECT_TRUE(torch::equal(dtrain::state_dict(*target)["1.weight"],
                           dtrain::state_dict(*model)["1.weight"]));
  auto local = make_model("mlp");
  const auto local_dir =
      g_env->dir / "server" / "artifacts";  // the server's --artifacts-destination
  std::string found;
  for (const auto& e : fs::recursive_directory_iterator(local_dir))
    if (e.path().parent_path().filename() == "weights" &&
        e.path().string().find(id) != std::string::npos)
      found = e.path().parent_path().string();
  ASSERT_NE(found, "");
  mlflow::load_state_dict(*local, "file://" + found);
  EXPECT_TRUE(
      torch::equal(dtrain::state_dict(*local)["5.bias"], dtrain::state_dict(*model)["5.bias"]));
}

TEST(MlflowStateDict, ARunInAFileStoreRoundTripsThroughItsRunsUri) {
  // No server: the file store's run directory (file:), as an offline run writes it.
  dtrain::test::ScopedEnv env;
  env.set("MLFLOW_TRACKING_URI", nullptr);
  const std::string store = "file:" + (g_env->dir / "mlruns").string();
  auto run = mlflow::Run::start({.tracking_uri = store, .experiment = "offline"});
  ASSERT_TRUE(run.active());
  torch::manual_seed(5);
  auto model = make_model("mlp");
  mlflow::log_state_dict(run, *model, "nested/weights");
  const std::string id = run.id();
  run.end();
  auto loaded = make_model("mlp");
  mlflow::load_state_dict(*loaded, "runs:/" + id + "/nested/weights", {.tracking_uri = store});
  for (const auto& item : dtrain::state_dict(*model))
    EXPECT_TRUE(torch::equal(item.value(), dtrain::state_dict(*loaded)[item.key()])) << item.key();
  expect_one_line_error(
      [&] { mlflow::load_state_dict("runs:/" + id + "/weights", {.tracking_uri = store}); },
      {"no state_dict.pth", "artifacts/weights"});
}

}  // namespace
