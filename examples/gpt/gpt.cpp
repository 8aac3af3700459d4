#include "gpt.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <set>

#include "dtrain/collectives.h"
#include "dtrain/error.h"
#include "dtrain/tensor_parallel.h"

namespace gpt {

using dtrain::ColumnParallelLinear;
using dtrain::GroupPtr;
using dtrain::RowParallelLinear;
using dtrain::VocabParallelEmbedding;

Corpus load_corpus(const std::string& path, int64_t block) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw dtrain::UsageError("gpt: cannot read the corpus '" + path +
                             "'; pass --corpus FILE (any text file)");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (static_cast<int64_t>(text.size()) <= block) {
    throw dtrain::UsageError("gpt: the corpus '" + path + "' has " + std::to_string(text.size()) +
                             " bytes; it needs more than the context length " +
                             std::to_string(block));
  }
  std::set<unsigned char> chars(text.begin(), text.end());
  std::vector<int64_t> index(256, -1);
  int64_t next = 0;
  for (unsigned char c : chars) index[c] = next++;
  Corpus out;
  out.ids = torch::empty({static_cast<int64_t>(text.size())}, torch::kInt64);
  auto a = out.ids.accessor<int64_t, 1>();
  for (size_t i = 0; i < text.size(); ++i) a[i] = index[static_cast<unsigned char>(text[i])];
  out.distinct = next;
  out.vocab = (next + 7) / 8 * 8;
  return out;
}

namespace {

// Token embedding (vocabulary split over tp) plus a learned position embedding (replicated).
class EmbedImpl : public torch::nn::Module {
 public:
  EmbedImpl(int64_t vocab, int64_t d, int64_t block, GroupPtr tp)
      : tok(register_module("tok", VocabParallelEmbedding(vocab, d, tp))),
        pos(register_parameter("pos", torch::randn({block, d}) * 0.02)) {}
  torch::Tensor forward(const torch::Tensor& ids) {
    return tok(ids) + pos.narrow(0, 0, ids.size(1));
  }
  VocabParallelEmbedding tok;
  torch::Tensor pos;
};
TORCH_MODULE(Embed);

// Pre-norm transformer block, Megatron-style: attention heads and MLP columns split over tp;
// q, k, v and fc1 are column-parallel (no gather), proj and fc2 row-parallel, so the block
// costs one all-reduce per sub-layer forward and one backward.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t d, int64_t heads, GroupPtr tp)
      : ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        q(register_module("q", ColumnParallelLinear(d, d, tp, true, false))),
        k(register_module("k", ColumnParallelLinear(d, d, tp, true, false))),
        v(register_module("v", ColumnParallelLinear(d, d, tp, true, false))),
        proj(register_module("proj", RowParallelLinear(d, d, tp, true, true))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", ColumnParallelLinear(d, 4 * d, tp, true, false))),
        fc2(register_module("fc2", RowParallelLinear(4 * d, d, tp, true, true))),
        head_dim_(d / heads) {
    const int t = tp ? tp->world_size() : 1;
    if (d % heads != 0 || heads % t != 0) {
      throw dtrain::UsageError("gpt: d_model " + std::to_string(d) +
                               " must be divisible by n_heads " + std::to_string(heads) +
                               ", and n_heads by tp " + std::to_string(t));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), L = x.size(1);
    auto split = [&](const torch::Tensor& t) {
      return t.view({B, L, -1, head_dim_}).transpose(1, 2);
    };
    torch::Tensor h = ln1(x);
    torch::Tensor qh = split(q(h)), kh = split(k(h)), vh = split(v(h));  // [B, heads/T, L, hd]
    torch::Tensor scores =
        torch::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
    torch::Tensor causal = torch::ones({L, L}, torch::kBool).triu(1);
    torch::Tensor att = torch::softmax(scores.masked_fill(causal, -1e9), -1);
    torch::Tensor y = torch::matmul(att, vh).transpose(1, 2).reshape({B, L, -1});
    torch::Tensor out = x + proj(y);
    return out + fc2(torch::gelu(fc1(ln2(out))));
  }
  torch::nn::LayerNorm ln1;
  ColumnParallelLinear q, k, v;
  RowParallelLinear proj;
  torch::nn::LayerNorm ln2;
  ColumnParallelLinear fc1;
  RowParallelLinear fc2;

 private:
  int64_t head_dim_;
};
TORCH_MODULE(Block);

// Final norm and the output projection, split over the vocabulary: it returns this rank's
// slice of the logits, which vocab_parallel_cross_entropy consumes without gathering them.
class HeadImpl : public torch::nn::Module {
 public:
  HeadImpl(int64_t d, int64_t vocab, GroupPtr tp)
      : ln(register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        out(register_module("out", ColumnParallelLinear(d, vocab, tp, false, false))) {}
  torch::Tensor forward(const torch::Tensor& x) { return out(ln(x)); }
  torch::nn::LayerNorm ln;
  ColumnParallelLinear out;
};
TORCH_MODULE(Head);

}  // namespace

torch::nn::Sequential make_model(const Config& cfg, int64_t vocab, const GroupPtr& tp) {
  torch::nn::Sequential model;
  model->push_back(std::string("embed"), Embed(vocab, cfg.d_model, cfg.block, tp));
  for (int64_t i = 0; i < cfg.n_layers; ++i)
    model->push_back("block" + std::to_string(i), Block(cfg.d_model, cfg.n_heads, tp));
  model->push_back(std::string("head"), Head(cfg.d_model, vocab, tp));
  return model;
}

Result train(const Config& cfg, const Corpus& corpus, const dtrain::DeviceMesh& mesh) {
  const int D = mesh.size("dp"), P = mesh.size("pp"), T = mesh.size("tp");
  if (cfg.batch % D != 0 || (cfg.batch / D) % cfg.micro_batches != 0) {
    throw dtrain::UsageError("gpt: the global batch " + std::to_string(cfg.batch) +
                             " must split into dp=" + std::to_string(D) +
                             " slices of micro_batches=" + std::to_string(cfg.micro_batches) +
                             " equal parts");
  }
  const GroupPtr tp = mesh.group("tp");
  torch::nn::Sequential model;
  {
    // Every rank builds the whole model from the same seed, then keeps its stages, so the
    // sharded pipeline starts from exactly the single-process model. torch's RNG is one per
    // process: ranks that are threads of one process (tests) take turns.
    static std::mutex rng_mutex;
    std::lock_guard<std::mutex> lock(rng_mutex);
    torch::manual_seed(cfg.seed);
    model = make_model(cfg, corpus.vocab, tp);
  }
  const int stages = P * cfg.virtual_stages;
  dtrain::PipelineOptions po{cfg.schedule, cfg.micro_batches, cfg.virtual_stages};
  po.data_parallel =
      dtrain::DDPOptions{};  // over mesh.group("dp"): DDP's buckets average the gradients
  dtrain::Pipeline pipe(dtrain::split_sequential(model, stages), mesh, po);
  model = nullptr;  // the stages other ranks run are dropped here
  torch::optim::Adam opt(pipe.parameters(), torch::optim::AdamOptions(cfg.lr));
  const int64_t local_vocab = corpus.vocab / T;
  auto loss_fn = [&](const torch::Tensor& logits, const torch::Tensor& target) {
    return dtrain::vocab_parallel_cross_entropy(logits.reshape({-1, local_vocab}),
                                                target.reshape({-1}), tp);
  };
  Result result;
  for (const auto& p : pipe.parameters()) result.parameters_here += p.numel();
  const int64_t per_dp = cfg.batch / D, n = corpus.ids.size(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < cfg.steps; ++step) {
    // The same global batch on every rank and every mesh shape; dp rank d takes slice d.
    std::mt19937_64 rng(cfg.seed * 1000003 + static_cast<uint64_t>(step));
    std::uniform_int_distribution<int64_t> start(0, n - cfg.block - 1);
    std::vector<torch::Tensor> xs, ys;
    for (int64_t b = 0; b < cfg.batch; ++b) {
      const int64_t s = start(rng);
      if (b / per_dp != mesh.coordinate("dp")) continue;
      xs.push_back(corpus.ids.narrow(0, s, cfg.block));
      ys.push_back(corpus.ids.narrow(0, s + 1, cfg.block));
    }
    opt.zero_grad();
    torch::Tensor loss = pipe.train_step(torch::stack(xs), torch::stack(ys), loss_fn);
    opt.step();
    // The global loss: the last stage's (the same on its tp ranks), averaged over dp.
    torch::Tensor l = torch::zeros({1}, torch::kFloat64);
    if (pipe.is_last_stage()) l[0] = loss.item<double>();
    dtrain::AllReduceOptions o;
    o.group = mesh.world();
    dtrain::all_reduce(l, o);
    result.losses.push_back(l.item<double>() / (D * T));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

}  // namespace gpt
