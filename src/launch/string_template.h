// Python's string.Template(t).safe_substitute(...), which torchrun applies to two things: the
// console's line prefix (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: role_name, rank, local_rank)
// and every worker's arguments (torch.distributed.elastic.utils.macros: local_rank, so that
// `torchrun ... train.py --out 'log_${local_rank}'` gives each worker its own, and an argument
// with `$$` reaches the worker with `$`).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dtrain::launch {

// `$$` is `$`; `$name` and `${name}` are replaced where `vars` knows the name (an identifier:
// ASCII letters, digits and `_`, not starting with a digit); anything else stays as written.
std::string safe_substitute(const std::string& t, const std::map<std::string, std::string>& vars);

// An argument that safe_substitute gives back unchanged: every `$` doubled. For a program that
// hands arguments to `dtrain run` which must reach the workers as they are (the Distributor
// re-executing its driver, agents started over ssh for a launcher that does not substitute).
std::string escape_substitution(const std::string& s);

// torchrun's worker arguments: argv[1...] with ${local_rank} (and $local_rank) substituted;
// argv[0], the executable (python, or the program with --no-python), is left alone as torchrun
// leaves its entrypoint.
std::vector<std::string> substitute_local_rank(const std::vector<std::string>& argv,
                                               int local_rank);

}  // namespace dtrain::launch
