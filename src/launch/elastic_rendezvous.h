// Elastic rendezvous: `dtrain run --nnodes MIN:MAX --rdzv-backend c10d`. Rounds of agents
// that join, close and restart over the job's store (torchrun's c10d rendezvous, our own
// protocol on dtrain's store).
//
// Round R of job RUN_ID (keys under round_prefix(RUN_ID, R), see rendezvous.h):
//   1. If "closed" is set, R has started without us: count ourselves in "late" (the running
//      agents restart at their next tick when a node waits and they are fewer than MAX) and
//      go on to round R+1.
//   2. index = add("joined", 1) - 1. An index >= MAX is a spare: counted in "late", on to R+1.
//   3. Wait (up to the rendezvous timeout) until MIN agents joined; then the last call: until
//      MAX joined, or last_call passed, or someone closed the round.
//   4. compare_set("closed", "", <joined count>): the first value written is the round's node
//      count N for everyone. An index >= N came too late: counted in "late", on to R+1.
//   5. As the static rendezvous from here: publish node_<index>, wait for node_0..node_{N-1},
//      lay the ranks out in index order.
// A round that never reaches MIN within the timeout fails with TimeoutError naming how many
// joined and the minimum: after a node failure that leaves fewer than MIN, this is the reason
// the job stops.
#pragma once

#include <chrono>
#include <string>

#include "launch/rendezvous.h"

namespace dtrain::launch {

struct ElasticLimits {
  int min_nodes = 1;
  int max_nodes = 1;
  std::chrono::milliseconds last_call{std::chrono::seconds(30)};  // torchrun's default
  std::chrono::milliseconds timeout{std::chrono::seconds(900)};   // to reach min_nodes
};

// Joins round `round` or, if that one is closed or full, the first later one that admits us.
// The result's round is the round joined.
RendezvousResult elastic_rendezvous(store::StoreClient& store, const std::string& run_id, int round,
                                    const NodeInfo& self, const ElasticLimits& limits);

// True when `host` (an --rdzv-endpoint host) names this machine: a loopback address, or one
// that resolves to an address of one of its interfaces. With the c10d backend only such an
// agent tries to host the job's store (as torchrun's c10d backend decides); on other hosts
// binding the port would succeed too and start a second, separate job.
bool endpoint_is_local(const std::string& host);

// How many agents arrived after round `round` closed and wait for the next one.
int late_agents(store::StoreClient& store, const std::string& run_id, int round);

}  // namespace dtrain::launch
