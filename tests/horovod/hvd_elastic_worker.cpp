// Worker of hvd_elastic_test: hvd::elastic::run over a TorchState under
// `dtrain horovodrun --min-np ... --host-discovery-script ...`.
//   hvd_elastic_worker OUT VICTIM_RANK
// Trains hvd_elastic_common.h's model; commits every kCommitEvery steps; on the first attempt
// (TORCHELASTIC_RESTART_COUNT=0) rank VICTIM_RANK SIGKILLs itself before step kKillStep.
// Prints one line per commit and one where fn starts (the state it starts from); rank 0
// saves the final parameters to OUT.
//   hvd_elastic_worker grow OUT FILE
// As above without a victim: on the first attempt, rank 0 creates FILE after step kGrowStep
// (the test's discovery script then lists a third host) and every rank polls
// check_host_updates() and commits once it sees the host (commit() throws
// HostsUpdatedInterrupt and run() waits for the restart), or is restarted before that.
//   hvd_elastic_worker adasum OUT
// DistributedOptimizer with op Adasum for kAdasumSteps steps; rank r saves its parameters to
// OUT.<r>.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "dtrain/horovod.h"
#include "dtrain/horovod_elastic.h"
#include "horovod/hvd_elastic_common.h"

namespace hvd = dtrain::hvd;
using namespace hvd_elastic_test;

int adasum_main(const std::string& out) {
  hvd::init();
  auto model = make_model();
  auto sgd = make_optimizer(model);
  hvd::DistributedOptimizer opt(sgd, model->named_parameters(), {.op = hvd::Adasum});
  for (int step = 0; step < kAdasumSteps; ++step) {
    opt.zero_grad();
    loss(model, step, hvd::rank()).backward();
    opt.step();
  }
  std::vector<torch::Tensor> params;
  for (auto& p : model->parameters()) params.push_back(p.detach().clone());
  torch::save(params, out + "." + std::to_string(hvd::rank()));
  std::printf("adasum done rank=%d size=%d\n", hvd::rank(), hvd::size());
  hvd::shutdown();
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "adasum") return adasum_main(argv[2]);
  const bool grow = argc == 4 && std::string(argv[1]) == "grow";
  if (grow) {
    argv[1] = argv[2];
    argv[2] = const_cast<char*>("-1");
  }
  const std::string grow_file = grow ? argv[3] : "";
  if (argc != 3 && !grow) {
    std::fprintf(stderr, "usage: hvd_elastic_worker OUT VICTIM_RANK\n");
    return 2;
  }
  const std::string out = argv[1];
  const int victim = std::atoi(argv[2]);
  const char* rc = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const int attempt = rc ? std::atoi(rc) : 0;

  hvd::init();
  auto model = make_model();
  auto sgd = make_optimizer(model);
  hvd::DistributedOptimizer opt(sgd, model->named_parameters());
  hvd::elastic::TorchState state(*model, &sgd, {{"step", 0}});
  int resets = 0;
  state.register_reset_callbacks({[&] { ++resets; }});

  hvd::elastic::run(state, [&](hvd::elastic::TorchState& s) {
    std::printf("start rank=%d size=%d attempt=%d step=%lld sum=%.17g resets=%d from=%s pid=%d\n",
                hvd::rank(), hvd::size(), attempt, static_cast<long long>(s["step"]),
                param_sum(model), resets, s.resumed_from().empty() ? "-" : s.resumed_from().c_str(),
                static_cast<int>(::getpid()));
    std::fflush(stdout);
    for (; s["step"] < kSteps;) {
      const int step = static_cast<int>(s["step"]);
      if (attempt == 0 && step == kKillStep && hvd::rank() == victim) ::raise(SIGKILL);
      opt.zero_grad();
      loss(model, step, hvd::rank()).backward();
      opt.step();
      ++s["step"];
      if (grow && attempt == 0 && s["step"] == kGrowStep) {
        if (hvd::rank() == 0) {
          if (std::FILE* f = std::fopen(grow_file.c_str(), "w")) std::fclose(f);
        }
        for (int i = 0; i < 300 && !s.check_host_updates(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::printf("rank=%d saw the new host\n", hvd::rank());
        std::fflush(stdout);
        s.commit();  // throws HostsUpdatedInterrupt (unless the restart came first)
        std::fprintf(stderr, "rank %d: the host was not seen in 30 s\n", hvd::rank());
        return;
      }
      if (s["step"] % kCommitEvery == 0) {
        s.commit();
        std::printf("commit rank=%d size=%d step=%lld sum=%.17g\n", hvd::rank(), hvd::size(),
                    static_cast<long long>(s["step"]), param_sum(model));
        std::fflush(stdout);
      }
    }
  });
  if (hvd::rank() == 0) {
    std::vector<torch::Tensor> params;
    for (auto& p : model->parameters()) params.push_back(p.detach().clone());
    torch::save(params, out);
  }
  std::printf("done rank=%d size=%d\n", hvd::rank(), hvd::size());
  hvd::shutdown();
  return 0;
}
