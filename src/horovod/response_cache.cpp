// hvd's response cache (see controller.h): a request that ran after a full negotiation in
// which every rank submitted the same line gets a bit, the same on every rank; later hits are
// agreed on by one small all-reduce of the bits instead of the full exchange.
#include <algorithm>

#include "dtrain/collectives.h"
#include "dtrain/error.h"
#include "horovod/controller.h"
#include "horovod/wire.h"

namespace dtrain::hvd::detail {

bool Controller::cacheable(Kind k) {
  return k == Kind::kAllreduce || k == Kind::kBroadcast || k == Kind::kReducescatter;
}

std::vector<int> Controller::sync_cache(bool& need_full, bool fresh_work) {
  // One sum all-reduce of int32: [ranks needing the full exchange, ranks with fresh work,
  // then per cache bit the ranks holding that request]. A bit every rank holds is ready.
  const size_t nbits = cache_names_.size();
  auto v = torch::zeros({static_cast<int64_t>(3 + nbits)}, torch::kInt32);
  auto* d = v.data_ptr<int32_t>();
  d[0] = need_full ? 1 : 0;
  d[1] = fresh_work ? 1 : 0;
  for (const auto& [bit, r] : hits_) d[3 + bit] = 1;
  AllReduceOptions ao;
  ao.group = group_;
  dtrain::all_reduce(v, ao);
  need_full = d[0] > 0;
  progressed_ = d[1] > 0;
  std::vector<int> ready;
  for (size_t b = 0; b < nbits; ++b) {
    const int have = d[3 + b];
    if (have == 0) continue;
    if (have == size_) {
      ready.push_back(static_cast<int>(b));
    } else if (timeline_) {
      auto& c = cache_.at(cache_names_[b]);
      timeline_->negotiate_start(cache_names_[b], kind_upper(c.kind));
    }
  }
  return ready;
}

void Controller::run_cached(const std::vector<int>& bits) {
  std::vector<Request> reqs;
  std::vector<Entry> entries;
  for (int b : bits) {
    auto it = hits_.find(b);
    DTRAIN_ASSERT(it != hits_.end(), "a ready cache bit this rank does not hold");
    Request r = std::move(it->second);
    hits_.erase(it);
    hit_names_.erase(r.name);
    hit_since_.erase(b);
    CacheEntry& c = cache_.at(r.name);
    c.last_used = ++exec_counter_;
    Entry e;
    e.sig.assign(static_cast<size_t>(size_),
                 "0\t" + c.sig);  // every rank's request equals the cached one
    e.seq.assign(static_cast<size_t>(size_), 0);
    e.count = size_;
    if (timeline_) {
      timeline_->negotiate_start(r.name, kind_upper(r.kind));
      timeline_->start(r.name, kind_upper(r.kind),
                       r.tensor.numel() * static_cast<int64_t>(r.tensor.element_size()));
      timeline_->activity_start(r.name, "QUEUE");
    }
    reqs.push_back(std::move(r));
    entries.push_back(std::move(e));
  }
  run_batch(reqs, entries);
}

void Controller::cache_insert(const std::string& name, const Entry& e) {
  if (options_.cache_capacity <= 0) return;
  for (const auto& line : e.sig) {
    if (line.empty() || strip_seq(line) != strip_seq(e.sig[0]))
      return;  // a joined rank, or options differ
  }
  const std::string sig = strip_seq(e.sig[0]);
  auto it = cache_.find(name);
  if (it != cache_.end()) {
    it->second.sig = sig;  // e.g. a new shape: the same bit, the new request
    it->second.kind = parse_sig(e.sig[0]).kind;
    it->second.last_used = ++exec_counter_;
    return;
  }
  int bit = -1;
  if (static_cast<int64_t>(cache_.size()) < options_.cache_capacity) {
    for (size_t b = 0; b < cache_names_.size(); ++b) {
      if (cache_names_[b].empty()) {
        bit = static_cast<int>(b);
        break;
      }
    }
    if (bit < 0) {
      bit = static_cast<int>(cache_names_.size());
      cache_names_.emplace_back();
    }
  } else {
    // Full: the least recently used entry goes (every rank counts uses alike). No rank holds
    // a request on its bit: this runs in a full exchange, where every held hit was announced.
    auto lru = cache_.begin();
    for (auto c = cache_.begin(); c != cache_.end(); ++c) {
      if (c->second.last_used < lru->second.last_used) lru = c;
    }
    bit = lru->second.bit;
    cache_.erase(lru);
  }
  cache_names_[static_cast<size_t>(bit)] = name;
  cache_.emplace(
      name, CacheEntry{sig, bit, static_cast<Kind>(parse_sig(e.sig[0]).kind), ++exec_counter_});
}

}  // namespace dtrain::hvd::detail
