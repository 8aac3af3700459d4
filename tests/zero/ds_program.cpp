// A training program as DeepSpeed launches it: `ds_program --deepspeed --deepspeed_config PATH
// --out FILE`; trains 10 ZeRO steps with that config, rank 0 writes what it saw to FILE.
#include <CLI/CLI.hpp>
#include <fstream>

#include "dtrain/dtrain.h"

int main(int argc, char** argv) {
  CLI::App app{"DeepSpeed-style program"};
  bool deepspeed = false;
  std::string config, out;
  app.add_flag("--deepspeed", deepspeed);
  app.add_option("--deepspeed_config", config)->required();
  app.add_option("--out", out)->required();
  CLI11_PARSE(app, argc, argv);
  auto pg = dtrain::init_process_group();
  auto model = torch::nn::Linear(6, 2);
  auto engine = dtrain::zero::initialize(model, config);
  for (int s = 0; s < 10; ++s) {
    engine.backward(engine(torch::randn({4, 6})).pow(2).mean());
    engine.step();
  }
  if (pg->rank() == 0) {
    std::ofstream(out) << "deepspeed=" << deepspeed << " stage=" << engine.config().zero.stage
                       << " world=" << pg->world_size() << " steps=" << engine.global_steps()
                       << "\n";
  }
  return 0;
}
