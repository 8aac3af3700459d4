// `dtrain horovodrun` and its worker shim `dtrain horovod-exec` (src/horovod/horovodrun.cpp).
#pragma once

#include <string>
#include <vector>

namespace dtrain::hvd {

// `dtrain horovodrun ARGS...` (args after the subcommand). Returns the exit code: 0, a
// failing worker's code, 2 for bad flags (the message says which and why), 1 otherwise.
int horovodrun_main(const std::vector<std::string>& args);

// `dtrain horovod-exec PROGRAM ARGS...`: sets HOROVOD_RANK, ... from the torchrun variables
// the agent gave this worker, then execs PROGRAM (a .py through python3). Returns only on error.
int horovod_exec_main(const std::vector<std::string>& args);

}  // namespace dtrain::hvd
