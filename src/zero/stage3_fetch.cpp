// ZeRO stage 3: gathering a unit's parameters around its forward and backward (see
// stage3_fetch.h).
#include "zero/stage3_fetch.h"

#include <algorithm>

#include "dtrain/error.h"
#include "zero/autocast.h"
#include "zero/engine_impl.h"

namespace dtrain::zero::detail {
namespace {

// at::linear saves W^T (a view of the gathered buffer) for backward; this saves W itself, a
// leaf, so backward reads whatever the parameter holds then (gathered again by the hook).
class Zero3Linear : public torch::autograd::Function<Zero3Linear> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w, const torch::Tensor& b) {
    ctx->save_for_backward({x, w, b});
    auto x2 = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
    auto y = b.defined() ? torch::addmm(b, x2, w.t()) : x2.mm(w.t());
    if (x.dim() == 2) return y;
    auto shape = x.sizes().vec();
    shape.back() = w.size(0);
    return y.view(shape);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &b = saved[2];
    auto g = grads[0];
    auto g2 = g.dim() == 2 ? g : g.reshape({-1, g.size(-1)});
    auto x2 = x.dim() == 2 ? x : x.reshape({-1, x.size(-1)});
    torch::Tensor gx, gw, gb;
    if (ctx->needs_input_grad(0)) gx = g2.mm(w).view(x.sizes());
    if (ctx->needs_input_grad(1)) gw = g2.t().mm(x2);  // as addmm's backward computes it for W^T
    if (b.defined() && ctx->needs_input_grad(2)) gb = g2.sum(0);
    return {gx, gw, gb};
  }
};

}  // namespace

torch::Tensor zero3_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  // Under torch.autocast (torch_autocast) as autocast runs at::linear: every floating input
  // cast to its dtype first (the casts are in the graph, so the gradients come back in the
  // parameters' dtype). A custom function's forward is not autocast by the dispatcher.
  if (const auto dtype = autocast_dtype(x.device().type())) {
    auto cast = [&](const torch::Tensor& t) {
      return t.defined() && t.is_floating_point() && t.scalar_type() != *dtype ? t.to(*dtype) : t;
    };
    return Zero3Linear::apply(cast(x), cast(w), cast(b));
  }
  return Zero3Linear::apply(x, w, b);
}

Stage3Fetch::Stage3Fetch(EngineImpl& core, std::vector<std::vector<size_t>> units) : core_(core) {
  unit_of_.assign(core_.params_.size(), SIZE_MAX);
  const auto& z = core_.config_.zero;
  const int64_t elem = c10::elementSize(core_.model_dtype_);
  for (auto& params : units) {
    Unit u;
    u.params = std::move(params);
    if (!u.params.empty()) {
      u.begin = core_.offsets_[u.params.front()];
      u.end = core_.offsets_[u.params.back()] + core_.numels_[u.params.back()];
      u.persistent = u.end - u.begin < z.stage3_param_persistence_threshold;
      for (auto i : u.params) unit_of_[i] = units_.size();
      ++stats_.units;
      if (u.persistent) {
        ++stats_.persistent_units;
        stats_.persistent_bytes += (u.end - u.begin) * elem;
      }
    }
    units_.push_back(std::move(u));
  }
  stats_.partition_bytes = nbytes(core_.param_part_);
  stats_.max_live_bytes = z.stage3_max_live_parameters * elem;
}

bool Stage3Fetch::any_resident() const {
  return std::any_of(units_.begin(), units_.end(),
                     [](const Unit& u) { return u.buffer.defined(); });
}

int64_t Stage3Fetch::held_bytes() const {
  int64_t n = 0;
  for (const auto& u : units_) n += nbytes(u.buffer);
  return n;
}

int64_t Stage3Fetch::live_elements() const {
  int64_t n = 0;
  for (const auto& u : units_)
    if (u.buffer.defined() && !u.persistent) n += u.end - u.begin;
  return n;
}

void Stage3Fetch::launch(size_t i) {
  auto& u = units_[i];
  if (u.buffer.defined() || u.params.empty()) return;
  const int64_t part = core_.part_;
  const int world = core_.world_, rank = core_.rank_;
  u.buffer = torch::empty({u.end - u.begin},
                          torch::TensorOptions().dtype(core_.model_dtype_).device(core_.device_));
  watched_.push_back({u.buffer.storage().getWeakStorageImpl(), nbytes(u.buffer)});
  trace("launch " + std::to_string(i));
  torch::NoGradGuard ng;
  for (int r = static_cast<int>(u.begin / part); r < world && r * part < u.end; ++r) {
    const int64_t lo = std::max(u.begin, r * part), hi = std::min(u.end, (r + 1) * part);
    if (lo >= hi) continue;
    auto piece = u.buffer.narrow(0, lo - u.begin, hi - lo);
    torch::Tensor wire_piece;
    if (r == rank) {
      auto own = core_.param_part_.narrow(0, lo - r * part, hi - lo);
      piece.copy_(own);
      if (world == 1) continue;
      wire_piece = own.device() == piece.device() ? own : piece.clone();  // sent from the partition
    } else {
      wire_piece = torch::empty({hi - lo}, piece.options());
      u.incoming.emplace_back(wire_piece, lo - u.begin);
    }
    BroadcastOptions o;
    o.group = core_.group_;
    o.src = r;
    auto w = wire(wire_piece);
    u.works.push_back(broadcast_async(w, o));
    core_.count(nbytes(piece) * (world - 1) / world);
  }
  ++stats_.fetches;
}

void Stage3Fetch::wait(size_t i) {
  auto& u = units_[i];
  if (u.params.empty()) return;
  if (!u.buffer.defined()) {
    launch(i);
    ++stats_.fetches_on_demand;
  }
  for (auto& w : u.works) w.wait();
  u.works.clear();
  torch::NoGradGuard ng;
  for (auto& [t, offset] : u.incoming) u.buffer.narrow(0, offset, t.numel()).copy_(t);
  u.incoming.clear();
  if (u.pointed) return;
  for (auto k : u.params)
    core_.params_[k].set_data(
        u.buffer.narrow(0, core_.offsets_[k] - u.begin, core_.numels_[k]).view(core_.shapes_[k]));
  u.pointed = true;
}

void Stage3Fetch::release(size_t i) {
  auto& u = units_[i];
  if (!u.buffer.defined()) return;
  for (auto& w : u.works) w.wait();  // every rank took part: it must complete
  u.works.clear();
  u.incoming.clear();
  torch::NoGradGuard ng;
  auto empty =
      torch::empty({0}, torch::TensorOptions().dtype(core_.model_dtype_).device(core_.device_));
  for (auto k : u.params) core_.params_[k].set_data(empty);
  u.buffer = torch::Tensor();
  u.pointed = false;
  trace("release " + std::to_string(i));
}

void Stage3Fetch::record_use(size_t i, bool in_backward) {
  if (units_[i].params.empty() || !in_pass(in_backward)) return;
  if (uses_.size() > 64 * units_.size()) {
    // Forwards with autograd on but no backward (nothing ends the pass): not a trace.
    uses_.clear();
    trace_uses_.clear();
  }
  const size_t k = uses_.size();
  on_trace_ = (k == 0 || on_trace_) && k < trace_uses_.size() && trace_uses_[k] == i;
  uses_.push_back(i);
}

void Stage3Fetch::release_after_use(size_t i, bool in_backward) {
  auto& u = units_[i];
  if (u.persistent) return;
  // DeepSpeed's __params_to_release: walk the trace after this use, counting the elements of
  // each unit used, until the distance is reached; a unit met on the way stays gathered.
  if (on_trace_ && in_pass(in_backward)) {
    const int64_t max_distance = core_.config_.zero.stage3_max_reuse_distance;
    int64_t traversed = 0;
    for (size_t k = uses_.size(); k < trace_uses_.size() && traversed < max_distance; ++k) {
      const size_t v = trace_uses_[k];
      if (v == i) {
        ++stats_.kept_for_reuse;
        trace("keep " + std::to_string(i));
        return;
      }
      traversed += units_[v].end - units_[v].begin;
    }
  }
  release(i);
}

void Stage3Fetch::prefetch_after(size_t i, int direction) {
  const auto& z = core_.config_.zero;
  int64_t budget = z.stage3_prefetch_bucket_size;
  for (int64_t v = static_cast<int64_t>(i) + direction;
       v >= 0 && v < static_cast<int64_t>(units_.size()); v += direction) {
    auto& u = units_[v];
    if (u.params.empty() || u.buffer.defined()) continue;
    const int64_t n = u.end - u.begin;
    if (n > budget || live_elements() + n > z.stage3_max_live_parameters) break;
    launch(v);
    ++stats_.prefetches;
    budget -= n;
  }
}

void Stage3Fetch::begin_forward(size_t i) {
  wait(i);
  record_use(i, false);
  prefetch_after(i, +1);
  trace("forward " + std::to_string(i));
}

void Stage3Fetch::end_forward(size_t i, const torch::Tensor* out) {
  auto& u = units_[i];
  if (out && out->defined() && out->requires_grad() && !u.params.empty()) {
    out->register_hook([this, i, alive = std::weak_ptr<const bool>(alive_)](const torch::Tensor&) {
      if (alive.expired()) {
        throw UsageError(
            "zero stage 3: backward reached a unit whose engine no longer fetches it (the engine "
            "was "
            "destroyed, or fetch_units() was called again, after this forward); run backward "
            "before "
            "that, or run the forward again");
      }
      auto& unit = units_[i];
      unit.used_in_backward = true;
      unit.grads_pending = unit.params.size();
      wait(i);
      record_use(i, true);
      prefetch_after(i, -1);
      trace("backward " + std::to_string(i));
    });
  }
  release_after_use(i, false);
  trace("end " + std::to_string(i));
  record_resident();
}

void Stage3Fetch::on_grad_ready(size_t param) {
  const size_t i = unit_of_[param];
  if (i == SIZE_MAX) return;
  auto& u = units_[i];
  if (!u.used_in_backward || u.grads_pending == 0 || --u.grads_pending > 0) return;
  release_after_use(i, true);
  record_resident();
}

void Stage3Fetch::end_backward() {
  // This pass's order of uses is the trace the next one releases by.
  trace_uses_ = std::move(uses_);
  uses_.clear();
  on_trace_ = false;
  for (size_t i = 0; i < units_.size(); ++i) {
    auto& u = units_[i];
    u.used_in_backward = false;
    u.grads_pending = 0;
    if (u.persistent) {
      if (u.buffer.defined()) wait(i);
    } else {
      release(i);
    }
  }
  record_resident();
}

void Stage3Fetch::release_all() {
  for (size_t i = 0; i < units_.size(); ++i) {
    units_[i].used_in_backward = false;
    release(i);
  }
}

int64_t Stage3Fetch::resident_bytes() {
  int64_t n = nbytes(core_.param_part_);
  watched_.erase(std::remove_if(watched_.begin(), watched_.end(),
                                [](const Watched& w) { return w.storage.expired(); }),
                 watched_.end());
  for (const auto& w : watched_) n += w.bytes;
  return n;
}

void Stage3Fetch::record_resident() {
  stats_.peak_resident_bytes = std::max(stats_.peak_resident_bytes, resident_bytes());
}

}  // namespace dtrain::zero::detail
