// Reference values for collective tests: each rank's input and the reduction of all of them,
// computed directly. Shared by the threads-as-ranks unit tests and the multi-process worker.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "dtrain/collectives.h"

namespace dtrain::test {

// Rank r's input: small integers (1..3) that differ per rank and per element, so that sums
// and products over 4 ranks are exact in every dtype (int8 included: 3^4 = 81).
inline torch::Tensor reference_input(int rank, torch::IntArrayRef shape, torch::Dtype dtype) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  auto i = torch::arange(n, torch::kInt64);
  return ((i % 2) + 1 + ((i + rank) % 3 == 0).to(torch::kInt64)).reshape(shape).to(dtype);
}

// The reduction of every rank's reference_input, computed in float64, then cast.
inline torch::Tensor reference_reduce(ReduceOp op, int world, torch::IntArrayRef shape,
                                      torch::Dtype dtype) {
  std::vector<torch::Tensor> all;
  for (int r = 0; r < world; ++r)
    all.push_back(reference_input(r, shape, dtype).to(torch::kFloat64));
  auto s = torch::stack(all);
  torch::Tensor out;
  switch (op) {
    case ReduceOp::kSum:
      out = s.sum(0);
      break;
    case ReduceOp::kAvg:
      out = s.mean(0);
      break;
    case ReduceOp::kMin:
      out = std::get<0>(s.min(0));
      break;
    case ReduceOp::kMax:
      out = std::get<0>(s.max(0));
      break;
    case ReduceOp::kProduct:
      out = s.prod(0);
      break;
  }
  return out.to(dtype);
}

}  // namespace dtrain::test
