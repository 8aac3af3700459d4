// Tables a Python writer script makes for the data tests, written once per build tree (and
// again when the script changes) under BUILD/tests/<name>; a file lock keeps test processes
// that run at the same time from writing them together. The writers come from the venv
// (scripts/requirements.txt: pyarrow, deltalake); a failure throws with the script's output.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "launcher/subprocess.h"
#include "support/paths.h"

namespace dtrain::test {

inline std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// `script`: relative to the source tree; run as `python SCRIPT OUT`. Returns OUT.
inline std::string written_tables(const std::string& script, const std::string& name) {
  const std::string src = std::string(DTRAIN_SOURCE_DIR) + "/" + script;
  const std::string out = std::string(DTRAIN_BUILD_DIR) + "/tests/" + name;
  const std::string stamp = out + "/.written-by-" + std::filesystem::path(src).filename().string();
  int lock = ::open((out + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) throw std::runtime_error("cannot lock " + out);
  if (file_text(stamp) != file_text(src)) {
    using namespace std::chrono_literals;
    auto r = run_command({DTRAIN_VENV_PYTHON, src, out}, {.timeout = 600s});
    if (r.exit_code != 0) {
      ::close(lock);
      throw std::runtime_error(script +
                               " failed (its writers, pyarrow and deltalake, come from "
                               "scripts/requirements.txt): " +
                               r.out + r.err);
    }
    std::filesystem::copy_file(src, stamp, std::filesystem::copy_options::overwrite_existing);
  }
  ::close(lock);
  return out;
}

}  // namespace dtrain::test
