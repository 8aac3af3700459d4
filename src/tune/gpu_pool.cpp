// GPU instances handed to a local search's trials as Ray's raylet hands them; see gpu_pool.h.
#include "tune/gpu_pool.h"

#include <cmath>
#include <sstream>

namespace dtrain::tune::detail {

GpuPool::GpuPool(int gpus) : free_(static_cast<std::size_t>(gpus > 0 ? gpus : 0), kUnit) {}

std::optional<GpuPool::Allocation> GpuPool::acquire(std::int64_t units) {
  if (units <= 0) return std::nullopt;
  Allocation a(free_.size(), 0);
  std::int64_t left = units;
  // Whole instances first, lowest id first, while a whole one is still wanted.
  for (std::size_t i = 0; i < free_.size() && left >= kUnit; ++i) {
    if (free_[i] == kUnit) {
      a[i] = kUnit;
      left -= kUnit;
    }
  }
  if (left >= kUnit) return std::nullopt;
  if (left > 0) {
    // The best fit for the fraction: the least capacity left over, the lowest id on a tie. An
    // instance just taken whole has none free, so it is never chosen again here.
    std::optional<std::size_t> best;
    for (std::size_t i = 0; i < free_.size(); ++i) {
      const std::int64_t room = free_[i] - a[i];
      if (room >= left && (!best || room < free_[*best] - a[*best])) best = i;
    }
    if (!best) return std::nullopt;
    a[*best] += left;
  }
  for (std::size_t i = 0; i < free_.size(); ++i) free_[i] -= a[i];
  return a;
}

void GpuPool::release(const Allocation& a) {
  for (std::size_t i = 0; i < a.size() && i < free_.size(); ++i) free_[i] += a[i];
}

std::vector<int> GpuPool::ids(const Allocation& a) {
  std::vector<int> out;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] > 0) out.push_back(static_cast<int>(i));
  return out;
}

std::string GpuPool::visible_devices(const std::vector<int>& ids,
                                     const std::optional<std::string>& driver_list) {
  std::vector<std::string> names;
  if (driver_list) {
    // Ray's worker: "" lists none; otherwise split at every ",", entries kept as written.
    std::vector<std::string> listed;
    if (!driver_list->empty() && *driver_list != "NoDevFiles") {
      std::stringstream in(*driver_list);
      for (std::string d; std::getline(in, d, ',');) listed.push_back(d);
      if (driver_list->back() == ',') listed.emplace_back();
    }
    bool inside = true;
    for (int i : ids) inside = inside && i < static_cast<int>(listed.size());
    if (inside) {
      for (int i : ids) names.push_back(listed[static_cast<std::size_t>(i)]);
    } else {
      names = listed;
    }
  } else {
    for (int i : ids) names.push_back(std::to_string(i));
  }
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? "," : "") + names[i];
  return out;
}

std::int64_t gpu_units(double gpus) {
  return static_cast<std::int64_t>(std::llround(gpus * static_cast<double>(GpuPool::kUnit)));
}

}  // namespace dtrain::tune::detail
