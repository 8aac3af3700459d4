// HorovodRunner for C++ (Databricks' sparkdl.HorovodRunner), on dtrain's Distributor.
//
//     int main(int argc, char** argv) {
//       dtrain::init(argc, argv);                         // workers run the function, then exit
//       dtrain::hvd::HorovodRunner hr(-2);                // 2 processes on this machine
//       auto state = hr.run(train, /*lr=*/0.01);          // rank 0's return value
//     }
//     // train() calls dtrain::hvd::init() and uses hvd as under horovodrun.
//
// np < 0: -np processes on this machine (Databricks' local mode). np > 0: np processes on the
// cluster engine given in options.distributor.cluster (ssh, slurm, mpi or spark), exactly as
// the Distributor runs them (dtrain/distributor.h). The function follows the Distributor's
// rules: a plain function or a capture-less lambda whose arguments and result are encodable.
// A worker that throws or dies makes run() throw WorkerError (rank, exception, stderr tail).
#pragma once

#include <utility>

#include "dtrain/distributor.h"
#include "dtrain/error.h"

namespace dtrain::hvd {

struct HorovodRunnerOptions {
  // Everything but num_processes and local_mode (which np decides): cluster engine,
  // timeout, environment, log_dir, ...
  DistributorOptions distributor;
};

class HorovodRunner {
 public:
  // Throws UsageError for np == 0, or np > 0 without a cluster engine.
  explicit HorovodRunner(int np, HorovodRunnerOptions options = {})
      : distributor_(make_options(np, options)), np_(np) {}

  // Runs fn(args...) on every process; returns rank 0's result.
  template <class F, class... Args>
  auto run(F&& fn, Args&&... args) {
    return distributor_.run(std::forward<F>(fn), std::forward<Args>(args)...);
  }

  int np() const { return np_; }

 private:
  static DistributorOptions make_options(int np, const HorovodRunnerOptions& options) {
    if (np == 0) {
      throw UsageError(
          "HorovodRunner: np = 0; use np < 0 for -np local processes, np > 0 for the cluster");
    }
    DistributorOptions d = options.distributor;
    d.local_mode = np < 0;
    d.num_processes = np < 0 ? -np : np;
    if (np > 0 && d.cluster.engine.empty()) {
      throw UsageError(
          "HorovodRunner: np = " + std::to_string(np) +
          " runs on the cluster, but options.distributor.cluster.engine is empty; set it (ssh, "
          "slurm, mpi, spark) or use np = " +
          std::to_string(-np) + " for processes on this machine");
    }
    return d;
  }

  Distributor distributor_;
  int np_;
};

}  // namespace dtrain::hvd
