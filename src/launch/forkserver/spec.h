// The fork server's spec (protocol.h): parsed from bytes, libc only (the preload library has
// no C++ runtime), shared by the server and the fuzz target tests/fuzz/forkserver_spec_fuzz.cpp.
//
// The bytes come from the agent's memfd, but the parser does not trust them: every count is
// checked against the bytes that are left before anything is allocated for it (a count of
// 2^20 strings needs at least 4 MiB of lengths), so a corrupt spec costs at most a few times
// its own size, and everything allocated is freed when it turns out malformed.
#pragma once

#include <stdlib.h>
#include <string.h>

#include <cstdint>

#include "launch/forkserver/protocol.h"

namespace dtrain_forkserver {

struct RankSpec {
  int out_fd;
  int err_fd;
  char** envp;  // null-terminated
  int argc;     // 0: the server's own arguments
  char** argv;  // null-terminated; nullptr when argc is 0
  int ncpus;    // 0: not bound
  int* cpus;
  int mem_policy;  // 0: none; else MPOL_BIND or MPOL_PREFERRED
  int nnodes;
  int* nodes;
};

struct Spec {
  int n = 0;  // workers
  int agent_pid = 0;
  RankSpec* ranks = nullptr;
  int argc = 0;           // warm specs only
  char** argv = nullptr;  // warm specs only, null-terminated
};

namespace spec_detail {

inline bool take_u32(const char*& p, const char* end, uint32_t& v) {
  if (end - p < 4) return false;
  memcpy(&v, p, 4);
  p += 4;
  return true;
}

// `count` strings of (u32 length, bytes) into a new null-terminated array, or nullptr.
inline char** take_strings(const char*& p, const char* end, uint32_t count) {
  // Each string is at least its 4-byte length.
  if (count > static_cast<size_t>(end - p) / 4) return nullptr;
  char** out = static_cast<char**>(::calloc(count + 1, sizeof(char*)));
  if (out == nullptr) return nullptr;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t len = 0;
    if (!take_u32(p, end, len) || static_cast<size_t>(end - p) < len ||
        (out[i] = static_cast<char*>(::malloc(len + 1))) == nullptr) {
      for (uint32_t j = 0; j < i; ++j) ::free(out[j]);
      ::free(out);
      return nullptr;
    }
    memcpy(out[i], p, len);
    out[i][len] = '\0';
    p += len;
  }
  return out;
}

// `count` u32s into a new int array (nullptr, true for none), or false.
inline bool take_ints(const char*& p, const char* end, uint32_t count, int** out) {
  *out = nullptr;
  if (count == 0) return true;
  if (count > static_cast<size_t>(end - p) / 4) return false;
  *out = static_cast<int*>(::calloc(count, sizeof(int)));
  if (*out == nullptr) return false;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t v = 0;
    take_u32(p, end, v);
    (*out)[i] = static_cast<int>(v);
  }
  return true;
}

inline void free_strings(char** s) {
  if (s == nullptr) return;
  for (char** q = s; *q != nullptr; ++q) ::free(*q);
  ::free(s);
}

}  // namespace spec_detail

inline void free_spec(Spec* s) {
  if (s->ranks != nullptr) {
    for (int r = 0; r < s->n; ++r) {
      spec_detail::free_strings(s->ranks[r].envp);
      spec_detail::free_strings(s->ranks[r].argv);
      ::free(s->ranks[r].cpus);
      ::free(s->ranks[r].nodes);
    }
    ::free(s->ranks);
  }
  spec_detail::free_strings(s->argv);
  *s = Spec{};
}

// Parses a spec. A warm spec (kMagicWarm) carries the program's arguments and no fd numbers:
// the workers' fds are `fds` (stdout, stderr of each worker in turn; nfds must be 2 * n).
// False (with *out empty) when the bytes are not a well-formed spec.
inline bool parse_spec(const char* buf, size_t size, bool warm, const int* fds, int nfds,
                       Spec* out) {
  using spec_detail::take_u32;
  *out = Spec{};
  const char* p = buf;
  const char* end = buf + size;
  uint32_t magic = 0, n = 0, pid = 0;
  if (!take_u32(p, end, magic) || magic != (warm ? kMagicWarm : kMagic) || !take_u32(p, end, n) ||
      !take_u32(p, end, pid)) {
    return false;
  }
  // A worker takes at least its four counts and its memory policy (and two fd numbers in a
  // cold spec).
  const size_t per_rank = warm ? 20 : 28;
  if (n == 0 || n > 65536 || n > static_cast<size_t>(end - p) / per_rank) return false;
  if (warm && (fds == nullptr || nfds != 2 * static_cast<int>(n))) return false;
  out->agent_pid = static_cast<int>(pid);
  if (warm) {
    uint32_t argc = 0;
    if (!take_u32(p, end, argc) || argc == 0 ||
        (out->argv = spec_detail::take_strings(p, end, argc)) == nullptr) {
      free_spec(out);
      return false;
    }
    out->argc = static_cast<int>(argc);
  }
  out->ranks = static_cast<RankSpec*>(::calloc(n, sizeof(RankSpec)));
  if (out->ranks == nullptr) {
    free_spec(out);
    return false;
  }
  out->n = static_cast<int>(n);
  for (uint32_t r = 0; r < n; ++r) {
    uint32_t out_fd = 0, err_fd = 0, nenv = 0;
    if (warm) {
      out_fd = static_cast<uint32_t>(fds[2 * r]);
      err_fd = static_cast<uint32_t>(fds[2 * r + 1]);
    } else if (!take_u32(p, end, out_fd) || !take_u32(p, end, err_fd)) {
      free_spec(out);
      return false;
    }
    out->ranks[r].out_fd = static_cast<int>(out_fd);
    out->ranks[r].err_fd = static_cast<int>(err_fd);
    RankSpec& rank = out->ranks[r];
    uint32_t nargs = 0, ncpus = 0, policy = 0, nnodes = 0;
    if (!take_u32(p, end, nenv) ||
        (rank.envp = spec_detail::take_strings(p, end, nenv)) == nullptr ||
        !take_u32(p, end, nargs) ||
        (nargs > 0 && (rank.argv = spec_detail::take_strings(p, end, nargs)) == nullptr) ||
        !take_u32(p, end, ncpus) || ncpus > 65536 ||
        !spec_detail::take_ints(p, end, ncpus, &rank.cpus) || !take_u32(p, end, policy) ||
        policy > 3 || !take_u32(p, end, nnodes) || nnodes > 4096 ||
        !spec_detail::take_ints(p, end, nnodes, &rank.nodes)) {
      free_spec(out);
      return false;
    }
    rank.argc = static_cast<int>(nargs);
    rank.ncpus = static_cast<int>(ncpus);
    rank.mem_policy = static_cast<int>(policy);
    rank.nnodes = static_cast<int>(nnodes);
  }
  return true;
}

}  // namespace dtrain_forkserver
