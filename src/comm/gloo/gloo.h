// c10d's Gloo backend, made the way dtrain uses it (the only file that includes c10d's
// ProcessGroupGloo.hpp is gloo.cpp: it needs Gloo's headers, which PyPI's torch wheel does not
// ship, so a build against it takes the system's - Debian's libgloo-dev).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <exception>
#include <optional>
#include <string>

#include "comm/c10d_compat.h"

namespace dtrain::comm {

// A Gloo backend of `world` ranks over `store`. Its device: `hostname` when given (tests use
// "127.0.0.1"), else the interface in GLOO_SOCKET_IFNAME when set, else Gloo's default (this
// host's name, or loopback). Every collective and store wait times out after `timeout`.
c10::intrusive_ptr<Backend> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                      int world, std::chrono::milliseconds timeout,
                                      const std::string& hostname = "");

// A Gloo backend on the same network device(s) as the Gloo backend `like` (a sub-group of
// `like`'s group, torch.distributed.new_group's way); Gloo's default device when `like` is
// not a Gloo backend.
c10::intrusive_ptr<Backend> make_gloo_like(Backend* like,
                                           const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                           int world, std::chrono::milliseconds timeout);

// Whether `backend` is c10d's Gloo backend.
bool is_gloo(Backend& backend);

// The timeout of a Gloo backend made by make_gloo(); nullopt for any other backend.
std::optional<std::chrono::milliseconds> gloo_timeout(Backend& backend);

// Whether `e` is Gloo's "a peer's connection failed" (gloo::IoException; in 2.x also c10d's
// DistNetworkError).
bool is_gloo_io_error(const std::exception_ptr& e);

}  // namespace dtrain::comm
