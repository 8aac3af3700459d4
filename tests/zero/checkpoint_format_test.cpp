// The checkpoint file format (src/zero/pickle.h): what dtrain writes reads back exactly, ranges
// of a Python torch.save file's tensors read on demand (TorchFile) as torch_load reads them,
// and a truncated, corrupt or foreign file is one line naming the file, from the API,
// load_checkpoint and `dtrain zero to-fp32` (no stack trace, no libtorch assert). Python's
// torch.load and DeepSpeed's zero_to_fp32 reading dtrain's files are in deepspeed_parity_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dtrain/zero.h"
#include "launcher/subprocess.h"
#include "support/paths.h"
#include "support/thread_group.h"
#include "zero/pickle.h"

namespace {

namespace fs = std::filesystem;
using namespace dtrain::zero::detail;
using namespace std::chrono_literals;

TEST(ZeroCheckpointFormat, WhatIsWrittenReadsBackExactly) {
  auto d = py_dict(/*ordered=*/true);
  py_set(d, "f32", py_tensor(torch::arange(6, torch::kFloat32).view({2, 3})));
  py_set(d, "f64_view", py_tensor(torch::arange(10, torch::kFloat64).narrow(0, 3, 4)));
  py_set(d, "bf16", py_tensor(torch::ones({3}, torch::kBFloat16)));
  py_set(d, "i64", py_tensor(torch::tensor(std::vector<int64_t>{-5, int64_t(1) << 40})));
  py_set(d, "scalar", py_tensor(torch::tensor(2.5)));
  py_set(d, "shape", py_size({4, 5}));
  py_set(d, "big", py_int(int64_t(1) << 50));
  py_set(d, "neg", py_int(-7));
  py_set(d, "x", py_float(0.1));
  py_set(d, "s", py_str("g\xc3\xbcnter"));
  py_set(d, "list", py_list({py_bool(true), py_none(), py_tuple({py_int(1), py_int(2)})}));
  auto back = torch_load(torch_save(*d), "mem");
  ASSERT_EQ(back->kind, PyValue::Kind::Dict);
  EXPECT_TRUE(back->ordered);
  EXPECT_TRUE(
      torch::equal(back->get("f32")->tensor, torch::arange(6, torch::kFloat32).view({2, 3})));
  EXPECT_TRUE(torch::equal(back->get("f64_view")->tensor,
                           torch::arange(10, torch::kFloat64).narrow(0, 3, 4)));
  EXPECT_EQ(back->get("bf16")->tensor.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(back->get("i64")->tensor[1].item<int64_t>(), int64_t(1) << 40);
  EXPECT_EQ(back->get("scalar")->tensor.dim(), 0);
  EXPECT_EQ(back->get("shape")->kind, PyValue::Kind::Size);
  EXPECT_EQ(back->get("big")->i, int64_t(1) << 50);
  EXPECT_EQ(back->get("neg")->i, -7);
  EXPECT_DOUBLE_EQ(back->get("x")->f, 0.1);
  EXPECT_EQ(back->get("s")->s, "g\xc3\xbcnter");
  ASSERT_EQ(back->get("list")->items.size(), 3u);
  EXPECT_EQ(back->get("list")->items[2]->items[1]->i, 2);
}

// A file Python's torch.save wrote, with views into one storage (an offset, a transposed
// view), a float16 tensor and a Parameter: TorchFile reads each tensor, and any range of one's
// elements into a destination of another dtype, as torch_load reads the whole file.
TEST(ZeroCheckpointFormat, TorchFileReadsRangesOfPythonsTensorsAsTorchLoad) {
  const fs::path file =
      fs::temp_directory_path() / ("zero_torchfile_" + std::to_string(::getpid()) + ".pt");
  const auto r = dtrain::test::run_command(
      {DTRAIN_VENV_PYTHON, "-c",
       "import sys, torch\n"
       "b = torch.arange(100, dtype=torch.float32)\n"
       "torch.save({'base': b, 'offset': b[10:30], 'transposed': b.view(10, 10).t(),\n"
       "            'half': torch.arange(8, dtype=torch.float16),\n"
       "            'param': torch.nn.Parameter(torch.ones(2, 3)), 'empty': torch.zeros(0)},\n"
       "           sys.argv[1])\n",
       file.string()},
      {.timeout = 120s});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  const auto whole = torch_load(bytes, file.string());
  TorchFile f(file.string());
  for (const char* key : {"base", "offset", "transposed", "half", "param", "empty"}) {
    const PyValue* lazy = f.value()->get(key);
    ASSERT_TRUE(lazy && lazy->kind == PyValue::Kind::Tensor) << key;
    const auto expected = whole->get(key)->tensor;
    EXPECT_TRUE(torch::equal(f.load(*lazy), expected)) << key;
    const int64_t n = expected.numel();
    const auto flat = expected.reshape({-1});
    // Every range of a few elements, into the tensor's dtype and into float64.
    for (int64_t begin = 0; begin < n; begin += 7) {
      const int64_t len = std::min<int64_t>(5, n - begin);
      auto same = torch::full({len}, -1, expected.options());
      f.read(*lazy, begin, same);
      EXPECT_TRUE(torch::equal(same, flat.narrow(0, begin, len))) << key << " at " << begin;
      auto wide = torch::full({len}, -1, torch::kFloat64);
      f.read(*lazy, begin, wide);
      EXPECT_TRUE(torch::equal(wide, flat.narrow(0, begin, len).to(torch::kFloat64)))
          << key << " at " << begin;
    }
  }
  // A range past the tensor's end is the caller's bug, refused before any read.
  auto two = torch::empty({2});
  EXPECT_THROW(f.read(*f.value()->get("offset"), 19, two), dtrain::InternalError);
  // Loaded in place, the value is what torch_load gives.
  const auto& all = f.load_all();
  EXPECT_TRUE(torch::equal(all->get("transposed")->tensor, whole->get("transposed")->tensor));
  EXPECT_TRUE(all->get("transposed")->storage.empty());
  fs::remove(file);
}

// One line, naming the file, and no trace of libtorch's internals.
void expect_one_line(const std::string& err, const std::string& file) {
  EXPECT_NE(err.find(file), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), err.size() - 1) << "more than one line:\n" << err;
  EXPECT_EQ(err.find("Exception raised from"), std::string::npos) << err;
  EXPECT_EQ(err.find("INTERNAL ASSERT"), std::string::npos) << err;
}

TEST(ZeroCheckpointFormat, TruncatedCorruptAndForeignFilesAreOneLineNamingTheFile) {
  const fs::path dir = fs::temp_directory_path() / ("zero_ckfmt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto engine = [](std::shared_ptr<dtrain::ProcessGroup> pg) {
    torch::manual_seed(1);
    torch::nn::Sequential m(torch::nn::Linear(4, 3));
    return dtrain::zero::initialize(m,
                                    nlohmann::json{{"train_micro_batch_size_per_gpu", 1},
                                                   {"optimizer", {{"type", "Adam"}}},
                                                   {"zero_optimization", {{"stage", 2}}}},
                                    {pg});
  };
  dtrain::test::run_ranks(2, [&](std::shared_ptr<dtrain::ProcessGroup> pg) {
    engine(pg).save_checkpoint(dir.string());
  });
  const fs::path tag = dir / "global_step0";
  const fs::path optim = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt";
  const fs::path model = tag / "mp_rank_00_model_states.pt";
  auto to_fp32 = [&] {
    return dtrain::test::run_command(
        {DTRAIN_BIN, "zero", "to-fp32", dir.string(), (dir / "out.pt").string()}, {.timeout = 60s});
  };
  ASSERT_EQ(to_fp32().exit_code, 0);
  // Truncated: half the file.
  const auto size = fs::file_size(optim);
  fs::resize_file(optim, size / 2);
  auto r = to_fp32();
  EXPECT_EQ(r.exit_code, 1);
  expect_one_line(r.err, optim.string());
  // load_checkpoint, which opens the files without reading them whole: the same error.
  dtrain::test::run_ranks(2, [&](std::shared_ptr<dtrain::ProcessGroup> pg) {
    auto e = engine(pg);
    try {
      e.load_checkpoint(dir.string());
      ADD_FAILURE() << "no error";
    } catch (const dtrain::Error& err) {
      expect_one_line(std::string(err.what()) + "\n", optim.string());
    }
  });
  // Corrupt: not a zip at all.
  std::ofstream(optim, std::ios::trunc) << "not a checkpoint";
  r = to_fp32();
  EXPECT_EQ(r.exit_code, 1);
  expect_one_line(r.err, optim.string());
  // Foreign: a torch.save file holding a list.
  {
    auto bytes = torch_save(*py_list({py_int(1)}));
    std::ofstream(model, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
  }
  r = to_fp32();
  EXPECT_EQ(r.exit_code, 1);
  expect_one_line(r.err, model.string());
  EXPECT_NE(r.err.find("holds a list"), std::string::npos) << r.err;
  // The API: a CheckpointError (a dtrain::Error) naming the file.
  try {
    dtrain::zero::consolidated_state_dict(dir.string());
    ADD_FAILURE() << "no error";
  } catch (const dtrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find(model.string()), std::string::npos) << e.what();
  }
  // A directory without `latest` and no tag given: a usage error of the command typed.
  fs::remove(dir / "latest");
  r = to_fp32();
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "dtrain zero to-fp32: " + (dir / "latest").string() +
                       " does not exist; give the tag (global_step<N>)\n");
  // The command's own usage line stays as it is.
  r = dtrain::test::run_command({DTRAIN_BIN, "zero", "to-fp32"}, {.timeout = 60s});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("usage: dtrain zero to-fp32 CHECKPOINT_DIR OUT", 0), 0u) << r.err;
  fs::remove_all(dir);
}

}  // namespace
