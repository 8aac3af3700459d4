// DeepSpeed's stage-3 checkpoint layout from and to dtrain's contiguous partitions.
#include "zero/stage3_layout.h"

#include <algorithm>

#include "dtrain/collectives.h"
#include "dtrain/process_group.h"
#include "zero/pickle.h"

namespace dtrain::zero::detail {

int64_t per_parameter_part(int64_t numel, int world) { return (numel + world - 1) / world; }

namespace {

// One piece this rank needs: flat elements [begin, end) land at `at` in its DeepSpeed group.
struct Piece {
  int64_t begin, end, at;
};

}  // namespace

torch::Tensor to_per_parameter(const std::shared_ptr<ProcessGroup>& group,
                               const torch::Tensor& part, const std::vector<int64_t>& numels,
                               int64_t chunk) {
  torch::NoGradGuard ng;
  const int world = group->world_size(), rank = group->rank();
  const auto local = part.detach().to(torch::kCPU).contiguous();
  const int64_t P = local.numel();
  // What this rank holds in DeepSpeed's layout, in the flat order's coordinates.
  std::vector<Piece> pieces;
  int64_t offset = 0, size = 0;
  for (int64_t n : numels) {
    const int64_t p = per_parameter_part(n, world);
    const int64_t b = std::min(rank * p, n), e = std::min((rank + 1) * p, n);
    if (e > b) pieces.push_back({offset + b, offset + e, size});
    offset += n;
    size += p;
  }
  auto out = torch::zeros({size}, local.options());
  if (world == 1) {
    for (const auto& pc : pieces)
      out.narrow(0, pc.at, pc.end - pc.begin).copy_(local.narrow(0, pc.begin, pc.end - pc.begin));
    return out;
  }
  // Every rank's part, `chunk` elements at a time: chunk k of rank s covers the flat elements
  // [s*P + k*chunk, s*P + k*chunk + len). Each rank copies what intersects its pieces.
  CollectiveOptions o;
  o.group = group;
  const int64_t step = std::max<int64_t>(1, std::min(chunk, P));
  auto gathered = torch::empty({world * step}, local.options());
  for (int64_t k0 = 0; k0 < P; k0 += step) {
    const int64_t len = std::min(step, P - k0);
    auto g = gathered.narrow(0, 0, world * len);
    all_gather_into_tensor(g, local.narrow(0, k0, len), o);
    for (int s = 0; s < world; ++s) {
      const int64_t lo = s * P + k0, hi = lo + len;
      // The pieces are in flat order: skip those that end before this chunk starts.
      auto it = std::lower_bound(pieces.begin(), pieces.end(), lo,
                                 [](const Piece& pc, int64_t v) { return pc.end <= v; });
      for (; it != pieces.end() && it->begin < hi; ++it) {
        const int64_t b = std::max(lo, it->begin), e = std::min(hi, it->end);
        out.narrow(0, it->at + (b - it->begin), e - b)
            .copy_(g.narrow(0, static_cast<int64_t>(s) * len + (b - lo), e - b));
      }
    }
  }
  return out;
}

torch::Tensor from_per_parameter(const std::vector<torch::Tensor>& flats,
                                 const std::vector<int64_t>& numels, const std::string& where) {
  const int world = static_cast<int>(flats.size());
  int64_t need = 0, total = 0;
  for (int64_t n : numels) {
    need += per_parameter_part(n, world);
    total += n;
  }
  for (int r = 0; r < world; ++r)
    if (flats[static_cast<size_t>(r)].numel() != need)
      throw CheckpointError(where + ": rank " + std::to_string(r) + "'s stage-3 flat group has " +
                            std::to_string(flats[static_cast<size_t>(r)].numel()) +
                            " elements; the model's " + std::to_string(numels.size()) +
                            " parameters over " + std::to_string(world) + " ranks need " +
                            std::to_string(need) +
                            " (another model, or a checkpoint of another "
                            "world size?)");
  if (world == 0) return torch::empty({0});
  auto out = torch::empty({total}, flats[0].options());
  int64_t offset = 0, at = 0;
  for (int64_t n : numels) {
    const int64_t p = per_parameter_part(n, world);
    for (int r = 0; r < world && r * p < n; ++r) {
      const int64_t len = std::min(p, n - r * p);
      out.narrow(0, offset + r * p, len)
          .copy_(flats[static_cast<size_t>(r)].reshape({-1}).narrow(0, at, len));
    }
    offset += n;
    at += p;
  }
  return out;
}

void scatter_per_parameter(const torch::Tensor& flat, int r, int world,
                           const std::vector<int64_t>& numels, int64_t lo, torch::Tensor& part,
                           const std::string& where) {
  int64_t need = 0;
  for (int64_t n : numels) need += per_parameter_part(n, world);
  if (flat.numel() != need)
    throw CheckpointError(where + ": rank " + std::to_string(r) + "'s stage-3 flat group has " +
                          std::to_string(flat.numel()) + " elements; the model's " +
                          std::to_string(numels.size()) + " parameters over " +
                          std::to_string(world) + " ranks need " + std::to_string(need) +
                          " (another model, or a checkpoint of another world size?)");
  const auto src = flat.reshape({-1});
  const int64_t hi = lo + part.numel();
  int64_t offset = 0, at = 0;  // the parameter's start in the flat order, in rank r's group
  for (int64_t n : numels) {
    const int64_t p = per_parameter_part(n, world);
    // Rank r holds the parameter's [r*p, min(n, (r+1)*p)): flat elements from offset + r*p.
    const int64_t first = offset + std::min(n, r * p), last = offset + std::min(n, (r + 1) * p);
    const int64_t a = std::max(lo, first), b = std::min(hi, last);
    if (a < b) part.narrow(0, a - lo, b - a).copy_(src.narrow(0, at + (a - first), b - a));
    offset += n;
    at += p;
  }
}

}  // namespace dtrain::zero::detail
