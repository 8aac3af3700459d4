// hvd's execution (see controller.h): the negotiated requests in their agreed order - fused
// allreduce groups (Adasum among them), and every other kind one by one - on hvd's group.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dtrain/collectives.h"
#include "dtrain/device.h"
#include "dtrain/error.h"
#include "horovod/controller.h"
#include "horovod/wire.h"

namespace dtrain::hvd::detail {

void Controller::execute(std::vector<std::string> names) {
  // Order: the submission number on the lowest rank that submitted each name.
  auto key = [&](const std::string& n) {
    const Entry& e = table_.at(n);
    for (int r = 0; r < size_; ++r) {
      if (e.seq[static_cast<size_t>(r)] >= 0)
        return std::pair<int, int64_t>(r, e.seq[static_cast<size_t>(r)]);
    }
    return std::pair<int, int64_t>(size_, 0);
  };
  std::sort(names.begin(), names.end(),
            [&](const auto& x, const auto& y) { return key(x) < key(y); });

  // Requests that fail validation fail on every rank alike and are dropped from the run.
  std::vector<std::string> runnable;
  for (auto& n : names) {
    Entry& e = table_.at(n);
    try {
      check_agreement(n, e);
      int ref = key(n).first;
      Sig s = parse_sig(e.sig[static_cast<size_t>(ref)]);
      bool some_joined = false;
      for (int r = 0; r < size_; ++r)
        some_joined = some_joined || (e.sig[static_cast<size_t>(r)].empty());
      if (some_joined && s.kind != Kind::kAllreduce && s.kind != Kind::kAllgather &&
          s.kind != Kind::kBarrier) {
        throw UsageError(
            "hvd: " + std::string(kind_name(s.kind)) + " '" + n +
            "' while some ranks have joined; only allreduce, allgather and barrier run with "
            "joined ranks");
      }
      runnable.push_back(n);
      if (cacheable(s.kind)) cache_insert(n, e);
    } catch (const Error&) {
      if (timeline_) {
        timeline_->start(n, "ERROR", -1);
        timeline_->end(n, "", "");
      }
      auto it = mine_.find(n);
      if (it != mine_.end()) {
        it->second.pending->finish({}, std::current_exception());
        mine_.erase(it);
      }
      table_.erase(n);
    }
  }

  // Build this rank's request for each name (a joined rank contributes zeros).
  std::vector<Request> reqs;
  std::vector<Entry> entries;
  for (auto& n : runnable) {
    Entry e = std::move(table_.at(n));
    table_.erase(n);
    auto it = mine_.find(n);
    Request r;
    if (it != mine_.end()) {
      r = std::move(it->second);
      mine_.erase(it);
    } else {
      int ref = 0;
      while (e.sig[static_cast<size_t>(ref)].empty()) ++ref;
      Sig s = parse_sig(e.sig[static_cast<size_t>(ref)]);
      r.kind = s.kind;
      r.name = n;
      auto shape = s.shape;
      if (s.kind == Kind::kAllgather && !shape.empty()) shape[0] = 0;
      // Where the other ranks' tensors are: a CUDA collective takes no CPU tensor.
      const torch::Device device = s.device != "cuda"  ? torch::Device(torch::kCPU)
                                   : last_cuda_device_ ? *last_cuda_device_
                                                       : dtrain::local_device(false);
      r.tensor = torch::zeros(
          shape,
          torch::TensorOptions().dtype(static_cast<c10::ScalarType>(s.dtype)).device(device));
      r.reduce.op = static_cast<ReduceOp>(s.op);
      r.reduce.prescale_factor = s.prescale;
      r.reduce.postscale_factor = s.postscale;
      r.reduce.compression = static_cast<Compression>(s.compression);
    }
    if (timeline_) {
      const int64_t bytes = r.tensor.defined()
                                ? r.tensor.numel() * static_cast<int64_t>(r.tensor.element_size())
                                : -1;
      timeline_->start(n, kind_upper(r.kind), bytes);
      timeline_->activity_start(n, "QUEUE");
    }
    reqs.push_back(std::move(r));
    entries.push_back(std::move(e));
  }
  run_batch(reqs, entries);
}

void Controller::run_batch(std::vector<Request>& reqs, std::vector<Entry>& entries) {
  // Join completes on its own (not in `names` while ranks are still missing).
  for (size_t i = 0; i < reqs.size();) {
    if (reqs[i].kind == Kind::kJoin) {
      // Every rank joined: the one whose join line was folded in last joined last.
      const int last = last_joined_;
      std::fill(joined_.begin(), joined_.end(), false);
      if (timeline_) timeline_->end(reqs[i].name, "", "");
      if (reqs[i].pending) {
        reqs[i].pending->join_last_rank = last;
        reqs[i].pending->finish(torch::tensor(static_cast<int64_t>(last)));
      }
      ++i;
      continue;
    }
    if (reqs[i].kind == Kind::kAllreduce) {
      // Fuse the run of compatible allreduces starting here.
      std::vector<Request*> group{&reqs[i]};
      int64_t bytes = reqs[i].tensor.numel() * static_cast<int64_t>(reqs[i].tensor.element_size());
      size_t j = i + 1;
      auto compatible = [&](const Request& a, const Request& b) {
        return b.kind == Kind::kAllreduce && a.tensor.scalar_type() == b.tensor.scalar_type() &&
               a.tensor.device() == b.tensor.device() && a.reduce.op == b.reduce.op &&
               a.reduce.prescale_factor == b.reduce.prescale_factor &&
               a.reduce.postscale_factor == b.reduce.postscale_factor &&
               a.reduce.compression == b.reduce.compression;
      };
      while (j < reqs.size() && compatible(reqs[i], reqs[j])) {
        int64_t b = reqs[j].tensor.numel() * static_cast<int64_t>(reqs[j].tensor.element_size());
        if (bytes + b > options_.fusion_threshold) break;
        bytes += b;
        group.push_back(&reqs[j]);
        ++j;
      }
      run_allreduce_group(group);
      i = j;
      continue;
    }
    run_one(reqs[i], entries[i]);
    ++i;
  }
}

void Controller::run_allreduce_group(std::vector<Request*>& reqs) {
  const Request& first = *reqs.front();
  const auto dtype = first.tensor.scalar_type();
  const bool floating = at::isFloatingType(dtype);
  const auto wire =
      (first.reduce.compression == Compression::fp16 && floating) ? torch::kHalf : dtype;
  AllReduceOptions ao;
  ao.group = group_;
  switch (first.reduce.op) {
    case ReduceOp::Min:
      ao.op = dtrain::ReduceOp::kMin;
      break;
    case ReduceOp::Max:
      ao.op = dtrain::ReduceOp::kMax;
      break;
    case ReduceOp::Product:
      ao.op = dtrain::ReduceOp::kProduct;
      break;
    default:
      ao.op = dtrain::ReduceOp::kSum;
      break;
  }
  const double pre = first.reduce.prescale_factor;
  double post = first.reduce.postscale_factor;
  if (first.reduce.op == ReduceOp::Average) {
    if (post == 1.0 && wire == dtype && floating) {
      // The average in the reduction itself (the shared-memory backend divides as it reduces,
      // as for DDP's buckets): no second pass over the buffer.
      ao.op = dtrain::ReduceOp::kAvg;
    } else {
      post /= size_;
    }
  }
  const bool adasum = first.reduce.op == ReduceOp::Adasum;
  // The reduction itself: a sum/min/max/product all-reduce, or Adasum per tensor.
  auto reduce = [&](torch::Tensor& buf) {
    if (!adasum) {
      dtrain::all_reduce(buf, ao);
      return;
    }
    std::vector<int64_t> counts;
    for (auto* r : reqs) counts.push_back(r->tensor.numel());
    adasum_reduce(buf, counts);
  };
  const char* reduce_activity =
      !timeline_ ? ""
                 : activity_name(first.tensor, adasum ? "ADASUM_ALLREDUCE" : "ALLREDUCE").c_str();
  // The timeline: every request of the group moves from QUEUE through the same activities.
  auto activity = [&](const char* what) {
    if (!timeline_) return;
    for (auto* r : reqs) timeline_->activity_start(r->name, what);
  };
  auto done = [&](Request& r, const torch::Tensor& out) {
    if (timeline_)
      timeline_->end(r.name, std::string(c10::toString(out.scalar_type())), c10::str(out.sizes()));
    if (r.pending) r.pending->finish(out);
  };
  try {
    torch::Tensor buffer;
    if (reqs.size() == 1 && wire == dtype && pre == 1.0) {
      // One tensor, nothing to convert: reduce it (or a copy) directly.
      Request& r = *reqs.front();
      buffer = (r.in_place && r.tensor.is_contiguous()) ? r.tensor : r.tensor.contiguous().clone();
      activity(reduce_activity);
      reduce(buffer);
      if (post != 1.0) buffer.mul_(post);
      if (r.in_place && !buffer.is_same(r.tensor)) r.tensor.copy_(buffer);
      done(r, r.in_place ? r.tensor : buffer);
      return;
    }
    activity("MEMCPY_IN_FUSION_BUFFER");
    int64_t total = 0;
    for (auto* r : reqs) total += r->tensor.numel();
    // The fusion buffer lives across cycles (Horovod's too): no allocation per step.
    const int64_t bytes = total * static_cast<int64_t>(c10::elementSize(wire));
    // On the tensors' device (a CUDA group fuses on the GPU).
    const auto device = first.tensor.device();
    if (!fusion_buffer_.defined() || fusion_buffer_.numel() < bytes ||
        fusion_buffer_.device() != device) {
      fusion_buffer_ = torch::empty({bytes}, torch::TensorOptions(torch::kUInt8).device(device));
    }
    buffer = fusion_buffer_.narrow(0, 0, bytes).view(wire);
    int64_t off = 0;
    for (auto* r : reqs) {
      auto slot = buffer.narrow(0, off, r->tensor.numel());
      if (pre != 1.0) {
        slot.copy_(r->tensor.reshape({-1}).mul(pre));
      } else {
        slot.copy_(r->tensor.reshape({-1}));
      }
      off += r->tensor.numel();
    }
    activity(reduce_activity);
    reduce(buffer);
    activity("MEMCPY_OUT_FUSION_BUFFER");
    // One pass scales the whole buffer (when it holds the result's dtype).
    const bool scaled = post != 1.0 && wire == dtype;
    if (scaled) buffer.mul_(post);
    off = 0;
    for (auto* r : reqs) {
      auto slot = buffer.narrow(0, off, r->tensor.numel()).view(r->tensor.sizes());
      off += r->tensor.numel();
      torch::Tensor out;
      if (r->in_place) {
        r->tensor.copy_(slot);
        if (post != 1.0 && !scaled) r->tensor.mul_(post);
        out = r->tensor;
      } else {
        out = slot.to(dtype, /*non_blocking=*/false, /*copy=*/true);
        if (post != 1.0 && !scaled) out.mul_(post);
      }
      done(*r, out);
    }
  } catch (...) {
    for (auto* r : reqs) {
      if (r->pending) r->pending->finish({}, std::current_exception());
    }
    throw;
  }
}

void Controller::adasum_reduce(torch::Tensor& buffer, const std::vector<int64_t>& counts) {
  // Recursive doubling: at distance d = 1, 2, 4, ... each rank swaps its vector with rank ^ d
  // and both combine the pair alike - a from the lower group, b from the upper - tensor by
  // tensor: a' = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b (a coefficient is 1 when its
  // norm is ~0). After log2(size) levels every rank holds
  // adasum(adasum(adasum(g0, g1), adasum(g2, g3)), ...). Dot products and the combination run
  // in float64; every level sends the whole vector (Horovod halves it per level instead).
  DTRAIN_ASSERT((size_ & (size_ - 1)) == 0, "Adasum on a size that is not a power of 2");
  const auto dtype = buffer.scalar_type();
  auto mine = buffer.reshape({-1}).to(torch::kFloat64);
  auto theirs = torch::empty_like(mine);
  PointToPointOptions po;
  po.group = group_;
  po.tag = 0x4164;  // "Ad"
  const double tiny = std::sqrt(std::numeric_limits<double>::min());
  for (int d = 1; d < size_; d <<= 1) {
    const int peer = rank_ ^ d;
    Work s = dtrain::send_async(mine, peer, po);
    Work r = dtrain::recv_async(theirs, peer, po);
    s.wait();
    r.wait();
    const bool lower = (rank_ & d) == 0;
    auto a = lower ? mine : theirs;
    auto b = lower ? theirs : mine;
    auto out = torch::empty_like(mine);
    int64_t off = 0;
    for (int64_t n : counts) {
      auto sa = a.narrow(0, off, n), sb = b.narrow(0, off, n);
      const double dot = sa.dot(sb).item<double>();
      const double na = sa.dot(sa).item<double>(), nb = sb.dot(sb).item<double>();
      const double ca = na >= tiny ? 1.0 - dot / na * 0.5 : 1.0;
      const double cb = nb >= tiny ? 1.0 - dot / nb * 0.5 : 1.0;
      auto slot = out.narrow(0, off, n);
      torch::add_out(slot, sa.mul(ca), sb, cb);
      off += n;
    }
    mine = out;
  }
  buffer.copy_(mine.view(buffer.sizes()).to(dtype));
}

void Controller::run_one(Request& req, Entry& entry) {
  try {
    torch::Tensor out;
    std::vector<Sig> sigs(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) {
      if (!entry.sig[static_cast<size_t>(r)].empty())
        sigs[static_cast<size_t>(r)] = parse_sig(entry.sig[static_cast<size_t>(r)]);
    }
    if (timeline_) {
      const char* op = req.kind == Kind::kBroadcast       ? "BCAST"
                       : req.kind == Kind::kAllgather     ? "ALLGATHER"
                       : req.kind == Kind::kAlltoall      ? "ALLTOALL"
                       : req.kind == Kind::kReducescatter ? "REDUCESCATTER"
                                                          : nullptr;
      const char* act = op ? activity_name(req.tensor, op).c_str() : nullptr;
      if (act) {
        timeline_->activity_start(req.name, act);
      } else {
        timeline_->activity_end(req.name);
      }
    }
    switch (req.kind) {
      case Kind::kBarrier:
        break;  // every rank submitted it: the negotiation was the barrier
      case Kind::kBroadcast: {
        BroadcastOptions bo;
        bo.group = group_;
        bo.src = req.root;
        out = req.in_place && req.tensor.is_contiguous() ? req.tensor
                                                         : req.tensor.contiguous().clone();
        dtrain::broadcast(out, bo);
        if (req.in_place && !out.is_same(req.tensor)) req.tensor.copy_(out);
        if (req.in_place) out = req.tensor;
        break;
      }
      case Kind::kAllgather: {
        std::vector<int64_t> rows(static_cast<size_t>(size_), 0);
        int64_t most = 0;
        for (int r = 0; r < size_; ++r) {
          const auto& s = sigs[static_cast<size_t>(r)];
          rows[static_cast<size_t>(r)] =
              entry.sig[static_cast<size_t>(r)].empty() || s.shape.empty() ? 0 : s.shape[0];
          most = std::max(most, rows[static_cast<size_t>(r)]);
        }
        auto tail = req.tensor.sizes().vec();
        if (tail.empty()) tail.push_back(1);
        tail[0] = most;
        auto padded = torch::zeros(tail, req.tensor.options());
        auto mine = req.tensor.dim() == 0 ? req.tensor.reshape({1}) : req.tensor;
        if (mine.size(0) > 0) padded.narrow(0, 0, mine.size(0)).copy_(mine);
        CollectiveOptions co;
        co.group = group_;
        auto parts = dtrain::all_gather(padded, co);
        std::vector<torch::Tensor> pieces;
        for (int r = 0; r < size_; ++r)
          pieces.push_back(
              parts[static_cast<size_t>(r)].narrow(0, 0, rows[static_cast<size_t>(r)]));
        out = torch::cat(pieces, 0);
        break;
      }
      case Kind::kAlltoall: {
        // Pad every (sender, receiver) chunk to the largest one, exchange equal chunks.
        int64_t most = 0;
        for (const auto& s : sigs) {
          for (auto v : s.splits) most = std::max(most, v);
        }
        auto shape = req.tensor.sizes().vec();
        shape[0] = most * size_;
        auto send = torch::zeros(shape, req.tensor.options());
        int64_t off = 0;
        for (int j = 0; j < size_; ++j) {
          int64_t n = req.splits[static_cast<size_t>(j)];
          if (n > 0) send.narrow(0, j * most, n).copy_(req.tensor.narrow(0, off, n));
          off += n;
        }
        auto recv = torch::empty_like(send);
        CollectiveOptions co;
        co.group = group_;
        dtrain::all_to_all(recv, send, co);
        std::vector<torch::Tensor> pieces;
        std::vector<int64_t> received;
        for (int r = 0; r < size_; ++r) {
          int64_t n = sigs[static_cast<size_t>(r)].splits[static_cast<size_t>(rank_)];
          received.push_back(n);
          pieces.push_back(recv.narrow(0, r * most, n));
        }
        out = torch::cat(pieces, 0);
        if (req.pending) req.pending->extra = torch::tensor(received, torch::kInt64);
        break;
      }
      case Kind::kReducescatter: {
        auto sum = req.tensor.contiguous().clone();
        AllReduceOptions ao;
        ao.group = group_;
        dtrain::all_reduce(sum, ao);
        if (req.reduce.op == ReduceOp::Average) sum.div_(size_);
        const int64_t n = sum.size(0), base = n / size_, extra = n % size_;
        const int64_t start = rank_ * base + std::min<int64_t>(rank_, extra);
        out = sum.narrow(0, start, base + (rank_ < extra ? 1 : 0)).clone();
        break;
      }
      default:
        DTRAIN_ASSERT(false, "unexpected request kind in run_one");
    }
    if (timeline_) {
      timeline_->end(req.name, out.defined() ? std::string(c10::toString(out.scalar_type())) : "",
                     out.defined() ? c10::str(out.sizes()) : "");
    }
    if (req.pending) req.pending->finish(out);
  } catch (...) {
    if (req.pending) req.pending->finish({}, std::current_exception());
    throw;
  }
}

}  // namespace dtrain::hvd::detail
