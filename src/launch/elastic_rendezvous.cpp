#include "launch/elastic_rendezvous.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "dtrain/error.h"

namespace dtrain::launch {

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(50);

std::string seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

int joined(store::StoreClient& store, const std::string& prefix) {
  return static_cast<int>(store.add(prefix + "joined", 0));
}

}  // namespace

int late_agents(store::StoreClient& store, const std::string& run_id, int round) {
  return static_cast<int>(store.add(round_prefix(run_id, round) + "late", 0));
}

RendezvousResult elastic_rendezvous(store::StoreClient& store, const std::string& run_id, int round,
                                    const NodeInfo& self, const ElasticLimits& limits) {
  const auto deadline = Clock::now() + limits.timeout;
  for (;; ++round) {
    const std::string prefix = round_prefix(run_id, round);
    if (store.check({prefix + "closed"})) {
      store.add(prefix + "late", 1);
      continue;
    }
    const int index = static_cast<int>(store.add(prefix + "joined", 1) - 1);
    if (index >= limits.max_nodes) {
      store.add(prefix + "late", 1);  // a spare: admitted when a later round has room
      continue;
    }
    // Wait for MIN, then the last call for more (up to MAX).
    int count = joined(store, prefix);
    while (count < limits.min_nodes && !store.check({prefix + "closed"})) {
      if (Clock::now() >= deadline) {
        throw TimeoutError(
            "rendezvous of job '" + run_id + "' round " + std::to_string(round) + ": only " +
            std::to_string(count) + " node(s) joined within " + seconds(limits.timeout) +
            " s, fewer than the minimum " + std::to_string(limits.min_nodes) + " of --nnodes " +
            std::to_string(limits.min_nodes) + ":" + std::to_string(limits.max_nodes) +
            "; start more agents with the same --rdzv-endpoint and --rdzv-id, lower MIN, "
            "or raise --rdzv-timeout");
      }
      std::this_thread::sleep_for(kPoll);
      count = joined(store, prefix);
    }
    const auto last_call_end = Clock::now() + limits.last_call;
    while (count < limits.max_nodes && Clock::now() < last_call_end &&
           !store.check({prefix + "closed"})) {
      std::this_thread::sleep_for(kPoll);
      count = joined(store, prefix);
    }
    const int nnodes = std::stoi(store.compare_set(
        prefix + "closed", "", std::to_string(std::min(count, limits.max_nodes))));
    if (index >= nnodes) {
      store.add(prefix + "late", 1);
      continue;
    }
    const std::string info =
        nlohmann::json{{"host", self.host}, {"nproc", self.nproc}, {"pid", self.pid}}.dump();
    store.set(prefix + "node_" + std::to_string(index), info);
    std::vector<std::string> keys;
    for (int k = 0; k < nnodes; ++k) keys.push_back(prefix + "node_" + std::to_string(k));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (!store.wait(keys, std::max(left, std::chrono::milliseconds(5000)))) {
      throw TimeoutError("rendezvous of job '" + run_id + "' round " + std::to_string(round) +
                         ": " + std::to_string(nnodes) +
                         " node(s) were admitted but not all published their "
                         "details in time (an agent died while joining?)");
    }
    std::vector<NodeInfo> nodes(static_cast<size_t>(nnodes));
    for (int k = 0; k < nnodes; ++k) {
      auto j = nlohmann::json::parse(store.get(keys[static_cast<size_t>(k)]));
      nodes[static_cast<size_t>(k)] = {j.at("host").get<std::string>(), j.at("nproc").get<int>(),
                                       j.at("pid").get<int>()};
    }
    return layout(round, index, nodes);
  }
}

bool endpoint_is_local(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) ifs = nullptr;
  bool local = false;
  for (addrinfo* a = res; a && !local; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) local = true;
      for (ifaddrs* i = ifs; i && !local; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
                in->sin_addr.s_addr) {
          local = true;
        }
      }
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) local = true;
      for (ifaddrs* i = ifs; i && !local; i = i->ifa_next) {
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET6 &&
            std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                        &in6->sin6_addr, sizeof(in6_addr)) == 0) {
          local = true;
        }
      }
    }
  }
  if (ifs) ::freeifaddrs(ifs);
  ::freeaddrinfo(res);
  return local;
}

}  // namespace dtrain::launch
