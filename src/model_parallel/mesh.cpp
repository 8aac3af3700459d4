#include "dtrain/mesh.h"

#include <set>

#include "dtrain/error.h"

namespace dtrain {

namespace {

std::string describe(const std::vector<std::pair<std::string, int>>& dims) {
  std::string s;
  for (const auto& [name, size] : dims)
    s += (s.empty() ? "" : " x ") + name + "=" + std::to_string(size);
  return s.empty() ? "(no dimensions)" : s;
}

}  // namespace

DeviceMesh::DeviceMesh(std::vector<std::pair<std::string, int>> dims,
                       std::shared_ptr<ProcessGroup> world)
    : dims_(std::move(dims)), world_(world ? std::move(world) : default_group()) {
  rank_ = world_->rank();
  world_size_ = world_->world_size();
  if (dims_.empty())
    throw UsageError("DeviceMesh: no dimensions; give e.g. {{\"dp\", " +
                     std::to_string(world_size_) + "}}");
  std::set<std::string> names;
  long long product = 1;
  for (const auto& [name, size] : dims_) {
    if (name.empty())
      throw UsageError("DeviceMesh: a dimension has an empty name (" + describe(dims_) + ")");
    if (!names.insert(name).second)
      throw UsageError("DeviceMesh: dimension '" + name + "' is named twice (" + describe(dims_) +
                       ")");
    if (size < 1) {
      throw UsageError("DeviceMesh: dimension '" + name + "' has size " + std::to_string(size) +
                       "; sizes must be >= 1");
    }
    product *= size;
  }
  if (product != world_size_) {
    throw UsageError("DeviceMesh: " + describe(dims_) + " makes " + std::to_string(product) +
                     " ranks but the group has " + std::to_string(world_size_) +
                     "; choose sizes whose product is the world size");
  }
  // Row-major coordinates of this rank: the last dimension varies fastest.
  coords_.assign(dims_.size(), 0);
  int rest = rank_;
  for (int d = ndim() - 1; d >= 0; --d) {
    coords_[d] = rest % dims_[d].second;
    rest /= dims_[d].second;
  }
  // One group per line of the mesh along each dimension. Every rank creates every group in
  // the same order (new_group's contract) and keeps the one it belongs to.
  groups_.resize(dims_.size());
  for (int d = 0; d < ndim(); ++d) {
    const int n = dims_[d].second;
    for (int base = 0; base < world_size_; ++base) {
      // `base` is the line's first rank exactly when its coordinate along d is 0.
      std::vector<int> c(dims_.size());
      int r = base;
      for (int k = ndim() - 1; k >= 0; --k) {
        c[k] = r % dims_[k].second;
        r /= dims_[k].second;
      }
      if (c[d] != 0) continue;
      std::vector<int> line;
      for (int i = 0; i < n; ++i) {
        c[d] = i;
        line.push_back(rank_at(c));
      }
      NewGroupOptions o;
      o.parent = world_;
      if (auto g = new_group(line, o)) groups_[d] = std::move(g);
    }
  }
}

int DeviceMesh::index_of(const std::string& dim) const {
  for (int d = 0; d < ndim(); ++d) {
    if (dims_[d].first == dim) return d;
  }
  throw UsageError("DeviceMesh: no dimension '" + dim + "'; this mesh has " + describe(dims_));
}

int DeviceMesh::size(const std::string& dim) const { return dims_[index_of(dim)].second; }
int DeviceMesh::coordinate(const std::string& dim) const { return coords_[index_of(dim)]; }
const std::shared_ptr<ProcessGroup>& DeviceMesh::group(const std::string& dim) const {
  return groups_[index_of(dim)];
}

std::vector<int> DeviceMesh::group_ranks(const std::string& dim) const {
  const int d = index_of(dim);
  std::vector<int> c = coords_, out;
  for (int i = 0; i < dims_[d].second; ++i) {
    c[d] = i;
    out.push_back(rank_at(c));
  }
  return out;
}

int DeviceMesh::rank_at(const std::vector<int>& coords) const {
  if (coords.size() != dims_.size()) {
    throw UsageError("DeviceMesh::rank_at: got " + std::to_string(coords.size()) +
                     " coordinates for " + describe(dims_));
  }
  int r = 0;
  for (int d = 0; d < ndim(); ++d) {
    if (coords[d] < 0 || coords[d] >= dims_[d].second) {
      throw UsageError("DeviceMesh::rank_at: coordinate " + std::to_string(coords[d]) + " along '" +
                       dims_[d].first + "' is outside 0-" + std::to_string(dims_[d].second - 1));
    }
    r = r * dims_[d].second + coords[d];
  }
  return r;
}

}  // namespace dtrain
