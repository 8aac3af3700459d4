// The smallest dtrain worker: join the job's Gloo group, all-reduce each rank's number,
// and check the sum. Run it with `dtrain run --nproc-per-node 2 hello_worker`.
#include <torch/torch.h>

#include <cstdio>
#include <exception>

#include "dtrain/process_group.h"

int main() try {
  auto pg = dtrain::init_process_group();
  std::vector<at::Tensor> t{torch::full({1}, static_cast<double>(pg->rank() + 1), torch::kFloat64)};
  pg->c10d()->allreduce(t)->wait();
  const int n = pg->world_size();
  const double expected = n * (n + 1) / 2.0;
  std::printf("hello from rank %d of %d: all_reduce(rank + 1) = %g (expected %g)\n", pg->rank(), n,
              t[0].item<double>(), expected);
  pg->barrier();
  return t[0].item<double>() == expected ? 0 : 1;
} catch (const std::exception& e) {
  // dtrain's errors say what was wrong and what to do (a bad RANK, an unreachable master).
  std::fprintf(stderr, "hello_worker: error: %s\n", e.what());
  return 1;
}
