#include "launch/rendezvous.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "dtrain/error.h"
#include "launch/worker_keys.h"

namespace dtrain::launch {

namespace {

std::string format_seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

}  // namespace

std::string round_prefix(const std::string& run_id, int round) {
  return agents_key_prefix() + run_id + "/round_" + std::to_string(round) + "/";
}

RendezvousResult layout(int round, int node_rank, const std::vector<NodeInfo>& nodes) {
  DTRAIN_ASSERT(
      node_rank >= 0 && node_rank < static_cast<int>(nodes.size()),
      "node rank " + std::to_string(node_rank) + " outside 0.." + std::to_string(nodes.size()));
  RendezvousResult r;
  r.round = round;
  r.node_rank = node_rank;
  r.nnodes = static_cast<int>(nodes.size());
  r.nodes = nodes;
  for (int k = 0; k < r.nnodes; ++k) {
    if (k < node_rank) r.rank_offset += nodes[k].nproc;
    r.world_size += nodes[k].nproc;
  }
  return r;
}

RendezvousResult rendezvous(store::StoreClient& store, const std::string& run_id, int round,
                            int node_rank, int nnodes, const NodeInfo& self,
                            std::chrono::milliseconds timeout) {
  const std::string prefix = round_prefix(run_id, round);
  if (node_rank < 0) {
    node_rank = static_cast<int>(store.add(prefix + "order", 1) - 1);
    if (node_rank >= nnodes) {
      throw UsageError("rendezvous: " + std::to_string(node_rank + 1) + " agents joined job '" +
                       run_id + "' but --nnodes is " + std::to_string(nnodes) +
                       "; start exactly --nnodes agents, or give this job its own --rdzv-id");
    }
  }
  const std::string info =
      nlohmann::json{{"host", self.host}, {"nproc", self.nproc}, {"pid", self.pid}}.dump();
  const std::string key = prefix + "node_" + std::to_string(node_rank);
  std::string stored = store.compare_set(key, "", info);
  if (stored != info) {
    std::string other = "another host";
    try {
      other = nlohmann::json::parse(stored).at("host").get<std::string>();
    } catch (const std::exception&) {
    }
    throw UsageError("rendezvous: node rank " + std::to_string(node_rank) +
                     " was already taken by an agent on " + other +
                     "; give every agent its own --node-rank in 0.." + std::to_string(nnodes - 1));
  }
  std::vector<std::string> keys;
  for (int k = 0; k < nnodes; ++k) keys.push_back(prefix + "node_" + std::to_string(k));
  if (!store.wait(keys, timeout)) {
    std::string missing;
    for (int k = 0; k < nnodes; ++k) {
      if (!store.check({keys[k]})) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
    }
    throw TimeoutError("rendezvous timed out after " + format_seconds(timeout) +
                       " s: node rank(s) " + missing + " of " + std::to_string(nnodes) +
                       " never joined job '" + run_id +
                       "'; start their agents with the same --master-addr/--master-port (or "
                       "--rdzv-endpoint) and --rdzv-id, or raise --rdzv-timeout");
  }
  std::vector<NodeInfo> nodes(nnodes);
  for (int k = 0; k < nnodes; ++k) {
    auto j = nlohmann::json::parse(store.get(keys[k]));
    nodes[k].host = j.at("host").get<std::string>();
    nodes[k].nproc = j.at("nproc").get<int>();
    nodes[k].pid = j.at("pid").get<int>();
  }
  return layout(round, node_rank, nodes);
}

}  // namespace dtrain::launch
