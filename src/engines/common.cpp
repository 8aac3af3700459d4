// What several engines share (see common.h).
#include "engines/common.h"
#include "core/hostfile.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>

namespace dtrain::engines {

std::optional<std::string> get(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

int to_int(const char* name, const std::string& v, const char* engine) {
  try {
    size_t used = 0;
    long x = std::stol(v, &used);
    if (used == v.size() && x >= 0 && x <= INT32_MAX) return static_cast<int>(x);
  } catch (const std::exception&) {
  }
  throw UsageError(std::string("environment variable ") + name + "='" + v +
                   "' is not a non-negative integer; " + engine +
                   " sets it: unset it, or start the program through " + engine);
}

std::optional<int> get_int(const EnvLookup& env, const char* name, const char* engine) {
  auto v = get(env, name);
  if (!v) return std::nullopt;
  return to_int(name, *v, engine);
}

int require_int(const EnvLookup& env, const char* name, const char* engine) {
  auto v = get_int(env, name, engine);
  if (!v) {
    throw UsageError(std::string("environment variable ") + name + " is not set, but other " +
                     engine + " variables are; start the program through " + engine +
                     " (or set RANK and WORLD_SIZE yourself)");
  }
  return *v;
}

void check_rank(const std::string& engine, int rank, int world, int local_rank, int local_world) {
  if (world < 1 || rank >= world || local_world < 1 || local_rank >= local_world ||
      local_world > world) {
    throw UsageError(
        engine + " variables are inconsistent: rank " + std::to_string(rank) + " of " +
        std::to_string(world) + ", local rank " + std::to_string(local_rank) + " of " +
        std::to_string(local_world) +
        "; need 0 <= rank < world size and 0 <= local rank < local size <= world size");
  }
}

void master_from_env(const EnvLookup& env, EngineTask& t) {
  if (auto a = get(env, "MASTER_ADDR"); a && !a->empty()) t.master_addr = *a;
  if (auto p = get(env, "MASTER_PORT"); p && !p->empty()) {
    int port = to_int("MASTER_PORT", *p, "the launcher");
    if (port < 1 || port > 65535) {
      throw UsageError("MASTER_PORT='" + *p +
                       "' is not a port number; set it to 1-65535 or unset it");
    }
    t.master_port = port;
  }
}

namespace {

std::string address_text(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

}  // namespace

bool is_loopback_address(const std::string& addr) {
  return addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::string host_name_address() {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  const std::string name = this_host_name();
  addrinfo* res = nullptr;
  std::string addr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) == 0) {
    for (addrinfo* a = res; a != nullptr && addr.empty(); a = a->ai_next) {
      std::string text = address_text(a->ai_addr);
      if (!is_loopback_address(text)) addr = text;
    }
    ::freeaddrinfo(res);
  }
  if (addr.empty()) {
    throw UsageError(
        std::string("this host's name '") + name +
        "' resolves only to a loopback address, which the cluster's nodes cannot "
        "reach; set ClusterOptions::driver_addr to this machine's address as the nodes see it");
  }
  return addr;
}

Route route_to(const std::string& host) {
  // A UDP connect sends nothing: it only asks the kernel which local address it would use.
  Route r;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return r;
  r.resolved = true;
  int fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    r.local = address_text(reinterpret_cast<sockaddr*>(&local));
  }
  r.target_loopback = is_loopback_address(address_text(res->ai_addr));
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  return r;
}

}  // namespace dtrain::engines
