// Runs a fuzz target (tests/fuzz/TARGET_fuzz.cpp) over its seed corpus and its regression
// inputs, in the normal test suite (no clang, no libFuzzer): every input a fuzzing run found
// a bug with stays fixed. DTRAIN_FUZZ_TARGET names the target (a string), DTRAIN_FUZZ_TEST
// too (an identifier: the test's name).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "support/paths.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace fs = std::filesystem;

char g_current[4096];

// A harness aborts on a finding: say which input it was, then die as before.
void name_the_input(int sig) {
  const char prefix[] = "\nfuzz replay: the input that failed: ";
  (void)!::write(2, prefix, sizeof(prefix) - 1);
  (void)!::write(2, g_current, std::strlen(g_current));
  (void)!::write(2, "\n", 1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::vector<fs::path> inputs(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file()) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// One test per target: FuzzReplay.<target>.
TEST(FuzzReplay, DTRAIN_FUZZ_TEST) {
  const fs::path base = fs::path(dtrain::test::source_dir()) / "tests" / "fuzz";
  auto files = inputs(base / "corpus" / DTRAIN_FUZZ_TARGET);
  ASSERT_FALSE(files.empty()) << "no seed corpus in " << (base / "corpus" / DTRAIN_FUZZ_TARGET);
  auto regressions = inputs(base / "regressions" / DTRAIN_FUZZ_TARGET);
  files.insert(files.end(), regressions.begin(), regressions.end());
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP}) ::signal(sig, name_the_input);
  for (const auto& f : files) {
    std::snprintf(g_current, sizeof(g_current), "%s", f.c_str());
    std::ifstream in(f, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replayed %zu seed and %zu regression input(s) of %s\n",
              files.size() - regressions.size(), regressions.size(), DTRAIN_FUZZ_TARGET);
}

}  // namespace
