// The workers' part of the job's store, between two attempts.
//
// The agents keep one store for the whole job (docs/ARCHITECTURE.md, "The store"), so the keys
// an attempt's workers write are still there when the next attempt starts. PyTorch 1.13's
// env:// rendezvous put them under /worker/attempt_<restart> (as dtrain's C++ workers still
// do); PyTorch 2.x's does not (it assumes a new store per restart, pytorch/pytorch#135712 and
// #167288), so a restarted Gloo group read the previous attempt's addresses and failed to
// connect, or hung. Before an attempt after the first, the agents therefore delete every key
// outside their own namespace (agents_key_prefix(): rendezvous, heartbeats, failures); the
// workers of the new attempt start with a store that holds only the agents' keys.
//
// Protocol (multi-node), round R under round_prefix(RUN_ID, R): once R's rendezvous is
// complete - every member agent has stopped and reaped its previous workers - the member with
// node rank 0 clears the workers' keys and sets "workers_cleared"; every agent waits for that
// key before it starts its workers.
//
// What it cannot cover: a request a dead worker sent that is still in the network when the
// next attempt starts (on one host none is: a killed process's bytes are already queued at
// the server when the agent reaps it, and are served before the agents' next requests).
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/store.h"

namespace dtrain::launch {

// The namespace of the agents' own keys: every key the launcher writes starts with it.
std::string agents_key_prefix();

// Deletes every key of `store` outside agents_key_prefix(); returns how many it deleted.
// REQUIRES: a v2 connection (StoreClient::list_keys). Throws what the client throws.
int64_t clear_worker_keys(store::StoreClient& store);

}  // namespace dtrain::launch
