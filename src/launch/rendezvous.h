// Rendezvous: the agents of one job agree on node ranks and the global rank layout.
//
// Protocol, over the job's store, for round R (the restart count) of job RUN_ID; every key
// lives under /dtrain/RUN_ID/round_R/:
//   1. An agent without a node rank (c10d backend) takes one: add("order", 1) - 1, in join
//      order. More joiners than nnodes is an error.
//   2. The agent claims its rank with compare_set("node_K", "", INFO), INFO being JSON
//      {host, nproc, pid}. Finding someone else's INFO there means two agents were given
//      the same --node-rank: an error naming both hosts.
//   3. It waits (up to the rendezvous timeout) until node_0 .. node_{nnodes-1} all exist;
//      on timeout the error names the node ranks that never joined.
//   4. Ranks are laid out in node order: node K's workers take global ranks
//      offset_K .. offset_K + nproc_K - 1, offset_K being the sum of nproc of nodes < K.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "dtrain/store.h"

namespace dtrain::launch {

struct NodeInfo {
  std::string host;
  int nproc = 0;
  int pid = 0;
};

struct RendezvousResult {
  int round = 0;
  int node_rank = 0;
  int nnodes = 1;
  int rank_offset = 0;  // global rank of this node's local rank 0
  int world_size = 0;
  std::vector<NodeInfo> nodes;  // by node rank
};

// The store key prefix of one round of one job.
std::string round_prefix(const std::string& run_id, int round);

// Joins round `round`. node_rank < 0 asks for one in join order.
// Throws UsageError for conflicting ranks or too many nodes, TimeoutError when nodes are
// missing at the deadline, NetworkError when the store is unreachable.
RendezvousResult rendezvous(store::StoreClient& store, const std::string& run_id, int round,
                            int node_rank, int nnodes, const NodeInfo& self,
                            std::chrono::milliseconds timeout);

// The layout alone (step 4), for tests and for single-node jobs that skip the store.
RendezvousResult layout(int round, int node_rank, const std::vector<NodeInfo>& nodes);

}  // namespace dtrain::launch
