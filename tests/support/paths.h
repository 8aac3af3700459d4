// Where a test finds the build it belongs to: the `dtrain` launcher, worker programs, the
// source tree and the venv - looked up at run time, not compiled in.
//
// Why not compile-time paths (-DDTRAIN_BIN="/abs/build/tools/dtrain"): an absolute path on
// the command line makes every test object differ between two clones of the same commit, so
// ccache (scripts/setup.sh) could not reuse the objects one clone built for another (CI's
// fresh clone, a developer's worktrees). Only the build-relative part is compiled in.
//
// The build tree is the nearest directory above the running executable that holds
// CMakeCache.txt; the source tree and the venv's python are read from that cache. A test
// executable copied out of its build tree fails with a message that says so.
#pragma once

#include <string>

namespace dtrain::test {

// The build tree of the running executable (absolute, no trailing slash).
const std::string& build_dir();
// CMAKE_HOME_DIRECTORY of that tree.
const std::string& source_dir();
// `relative` (e.g. "tools/dtrain") under build_dir(); the string lives as long as the process.
const char* built(const char* relative);
// DTRAIN_VENV_PYTHON of that tree: the venv with the pinned PyPI peers.
const char* venv_python();
// The python and torchrun of the PyTorch whose version matches the libtorch this build links
// (Debian's 1.13 for libtorch 1.13, the venv's for 2.x): C++ workers of this build meet them.
const char* native_python();
const char* native_torchrun();

}  // namespace dtrain::test

// The names the tests use (they were compile definitions before).
#define DTRAIN_BIN (::dtrain::test::built("tools/dtrain"))
#define DTRAIN_SOURCE_DIR (::dtrain::test::source_dir().c_str())
#define DTRAIN_BUILD_DIR (::dtrain::test::build_dir().c_str())
#define DTRAIN_VENV_PYTHON (::dtrain::test::venv_python())
#define DTRAIN_NATIVE_PYTHON (::dtrain::test::native_python())
#define DTRAIN_NATIVE_TORCHRUN (::dtrain::test::native_torchrun())
