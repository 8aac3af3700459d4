// Ray as a cluster engine (engine "ray"): a Distributor job placed on a Ray cluster.
//
//     dtrain::Distributor d({.num_processes = 4, .local_mode = false,
//                            .cluster = {.engine = "ray",
//                                        .ray = {.address = "head:6379",
//                                                .processes_per_bundle = 2,
//                                                .strategy = "STRICT_SPREAD"}}});
//
// The job is a Ray placement group of num_processes / processes_per_bundle bundles (each
// {"CPU": processes x num_cpus_per_process, "GPU": processes x num_gpus_per_process}, placed with
// `strategy`); each bundle runs one dtrain agent as a Ray task holding the bundle's resources,
// and the agent runs the bundle's workers (ranks [i x P, (i + 1) x P) on bundle i's node). The
// driver is python/dtrain/ray.py (Ray's Python API; `pip install 'ray[client]'` of the
// cluster's version where this program runs); results and failures come back through the
// Distributor's store, as with every engine. Settings: ClusterOptions::ray (dtrain/cluster.h).
// `dtrain run --ray-address ADDR --nnodes B --nproc-per-node P PROGRAM` runs a program the same
// way from a shell. See docs/clusters.md, "Ray".
#pragma once

#include <string>

namespace dtrain::ray {

// As a notebook keeps its ray.init() between Ray Train fit() calls, this process keeps one
// driver connected to the cluster between Distributor::run() calls
// (ClusterOptions::ray.keep_driver, the default): the first run() starts it (one ray.init),
// later ones with the same address and Python run their jobs in it, several at once (each its
// own placement group; Tune's trials). It disconnects when this process exits (however: it
// watches this process), after ClusterOptions::ray.driver_idle_timeout without a job, or on
// stop_kept_driver().

// The kept driver's cluster address; "" when none is connected.
std::string kept_driver();
// Disconnects the kept driver (if any) and waits (bounded) for it to exit. Thread-safe.
void stop_kept_driver();

}  // namespace dtrain::ray
