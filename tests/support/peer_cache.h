// A deterministic peer's results (DeepSpeed run on inputs that do not depend on dtrain), kept
// for the rest of one run of the suite. scripts/run_tests.sh runs every test on two builds
// (libtorch 2.x, then 1.13), and such a peer's side of a comparison is the same on both: the
// first build's run keeps the peer's output files, the second copies them instead of running
// the peer again. The peer still runs in every run of the suite, on the same inputs; nothing is
// kept between runs.
//
// DTRAIN_TEST_PEER_CACHE names the directory (run_tests.sh makes a fresh one per run and removes
// it at the end). Unset or empty - a test run by hand, ctest alone - every peer runs.
//
//   dtrain::test::cached_peer_run(key, dir, {"ds.json", "ds_0"}, [&] { run_deepspeed(...); });
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

namespace dtrain::test {

// The contents of `path` ("" if it cannot be read): peer scripts go into a cache key.
inline std::string file_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `run`, which writes `outputs` (files or directories, relative to `dir`), unless the cache
// holds this key's outputs: then they are copied into `dir` instead. `key` is everything the
// peer's results depend on (its script's text, its inputs); every occurrence of `dir` in it is
// replaced first, so the key does not depend on the test's temporary directory. Outputs are
// kept only after a run without a fatal failure.
inline void cached_peer_run(std::string key, const std::filesystem::path& dir,
                            const std::vector<std::string>& outputs,
                            const std::function<void()>& run) {
  namespace fs = std::filesystem;
  const char* root = std::getenv("DTRAIN_TEST_PEER_CACHE");
  if (root == nullptr || *root == '\0') return run();
  const std::string d = dir.string();
  for (size_t at = key.find(d); !d.empty() && at != std::string::npos; at = key.find(d, at))
    key.replace(at, d.size(), "<dir>");
  std::uint64_t h = 1469598103934665603ULL;  // FNV-1a, 64 bits
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  char name[17];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
  const fs::path entry = fs::path(root) / name;
  std::error_code ec;
  if (fs::is_directory(entry / "complete", ec)) {
    for (const auto& o : outputs) {
      fs::remove_all(dir / o, ec);
      fs::copy(entry / o, dir / o, fs::copy_options::recursive, ec);
      ASSERT_FALSE(ec) << "copying the peer's kept output " << (entry / o) << ": " << ec.message();
    }
    std::printf("(the peer's output from this run of the suite's first build: %s)\n",
                entry.c_str());
    return;
  }
  run();
  if (::testing::Test::HasFatalFailure()) return;
  // Written under a temporary name and renamed: a half-copied entry is never used.
  const fs::path tmp = fs::path(root) / (std::string(name) + ".tmp" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  bool ok = fs::create_directories(tmp, ec);
  for (const auto& o : outputs) {
    fs::copy(dir / o, tmp / o, fs::copy_options::recursive, ec);
    ok = ok && !ec;
  }
  if (ok) ok = static_cast<bool>(std::ofstream(tmp / "key") << key);  // what the entry answers
  if (ok) ok = fs::create_directory(tmp / "complete", ec);
  if (ok) fs::rename(tmp, entry, ec);
  if (!ok || ec) fs::remove_all(tmp, ec);  // not kept: the next build runs the peer itself
}

}  // namespace dtrain::test
