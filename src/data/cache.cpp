#include "data/cache.h"

namespace dtrain::data::detail {

RowGroupCache::RowGroupCache(int64_t budget_bytes, std::unique_ptr<SharedEntries> shared)
    : budget_(std::max<int64_t>(budget_bytes, 0)), shared_(std::move(shared)) {}

RowGroupCache::~RowGroupCache() = default;

RowGroupCache::Entry RowGroupCache::find(int64_t group) const {
  {
    MutexLock lock(mu_);
    auto it = entries_.find(group);
    if (it != entries_.end()) return it->second;
  }
  if (!shared_) return nullptr;
  auto mapped = shared_->find(group);  // another Reader of this host decoded it
  if (!mapped) return nullptr;
  MutexLock lock(mu_);
  return entries_.emplace(group, std::move(mapped)).first->second;
}

bool RowGroupCache::has_room(int64_t bytes) const {
  MutexLock lock(mu_);
  return bytes_ + bytes <= budget_;
}

RowGroupCache::Entry RowGroupCache::offer(int64_t group, int64_t bytes, const Decode& decode) {
  {
    MutexLock lock(mu_);
    auto it = entries_.find(group);
    if (it != entries_.end()) return it->second;  // another thread kept it first
    if (bytes_ + bytes > budget_)
      return std::make_shared<const std::vector<torch::Tensor>>(decode(nullptr));
    bytes_ += bytes;  // held while decoding, so no other row group overdraws the budget
  }
  Entry entry;
  try {
    // Shared: decoded straight into the entry's file, then put in place for the host.
    if (auto draft = shared_ ? shared_->draft(group) : nullptr) {
      decode(&draft->tensors);
      entry = draft->commit();
    } else {
      entry = std::make_shared<const std::vector<torch::Tensor>>(decode(nullptr));
    }
  } catch (...) {
    MutexLock lock(mu_);
    bytes_ -= bytes;
    throw;
  }
  MutexLock lock(mu_);
  auto [it, kept] = entries_.emplace(group, entry);
  if (!kept) bytes_ -= bytes;  // another thread kept it (or found it shared) meanwhile
  return it->second;
}

int64_t RowGroupCache::bytes() const {
  MutexLock lock(mu_);
  return bytes_;
}

std::vector<torch::Tensor> gather_rows(const std::vector<torch::Tensor>& whole, int64_t begin,
                                       int64_t end, const std::vector<int64_t>& order) {
  std::vector<torch::Tensor> out;
  out.reserve(whole.size());
  if (order.empty()) {
    for (const auto& t : whole) out.push_back(t.narrow(0, begin, end - begin).clone());
    return out;
  }
  auto pick =
      torch::from_blob(const_cast<int64_t*>(order.data()) + begin, {end - begin}, torch::kLong);
  for (const auto& t : whole) out.push_back(t.index_select(0, pick));
  return out;
}

}  // namespace dtrain::data::detail
