#include "data/cache.h"

namespace dtrain::data::detail {

RowGroupCache::RowGroupCache(int64_t budget_bytes) : budget_(std::max<int64_t>(budget_bytes, 0)) {}

RowGroupCache::Entry RowGroupCache::find(int64_t group) const {
  MutexLock lock(mu_);
  auto it = entries_.find(group);
  return it == entries_.end() ? nullptr : it->second;
}

bool RowGroupCache::has_room(int64_t bytes) const {
  MutexLock lock(mu_);
  return bytes_ + bytes <= budget_;
}

RowGroupCache::Entry RowGroupCache::offer(int64_t group, std::vector<torch::Tensor> tensors) {
  int64_t size = 0;
  for (const auto& t : tensors) size += static_cast<int64_t>(t.nbytes());
  auto entry = std::make_shared<const std::vector<torch::Tensor>>(std::move(tensors));
  MutexLock lock(mu_);
  auto it = entries_.find(group);
  if (it != entries_.end()) return it->second;  // another thread kept it first
  if (bytes_ + size > budget_) return entry;
  bytes_ += size;
  entries_.emplace(group, entry);
  return entry;
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
