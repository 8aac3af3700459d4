// Host lists, one parser for every reader (`dtrain run --hostfile/-H`, the ssh engine,
// `dtrain horovodrun -H/--hostfile`, the fuzz target): Open MPI's host file (`host slots=N`
// lines, `#` comments, blank lines; `max_slots`/`max-slots` accepted and ignored) and
// Horovod's -H list (`host1:2,host2`). Hosts without slots get `default_slots`; a host given
// twice is an error. Thread-safe (no state).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace dtrain {

// Throw UsageError naming the file, line and text that is wrong.
std::vector<std::pair<std::string, int>> parse_hostfile(const std::string& path, int default_slots);
std::vector<std::pair<std::string, int>> parse_host_list(const std::string& list,
                                                         int default_slots);

// "localhost", "ip6-localhost", "::1" or a 127.x address: a name for this machine that needs
// no lookup.
bool is_loopback_host(const std::string& host);
// A loopback name or this machine's host name (gethostname).
bool is_this_host(const std::string& host);
// This machine's host name (gethostname), "" when it cannot be read.
std::string this_host_name();

}  // namespace dtrain
