#include "store/core.h"

#include <algorithm>
#include <utility>

#include "core/memory.h"
#include "dtrain/error.h"

namespace dtrain::store {

namespace {

using wire::Encoder;
using wire::Op;
using wire::Protocol;

// Compares in time that depends only on the lengths, so a stranger cannot find the token
// byte by byte from how fast a wrong one is refused.
bool same_token(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

// Removes every occurrence of id from index[key], and the entry once it is empty.
void unlist(std::unordered_map<std::string, std::vector<int>>& index, const std::string& key,
            int id) {
  auto it = index.find(key);
  if (it == index.end()) return;
  std::erase(it->second, id);
  if (it->second.empty()) index.erase(it);
}

}  // namespace

Core::Core(Options options, Send send) : options_(std::move(options)), send_(std::move(send)) {}

Core::Conn* Core::find(int id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= conns_.size()) return nullptr;
  return conns_[id].get();
}

void Core::open(int id) {
  DTRAIN_ASSERT(id >= 0 && find(id) == nullptr,
                "store connection " + std::to_string(id) + " opened twice or negative");
  if (static_cast<std::size_t>(id) >= conns_.size()) conns_.resize(id + 1);
  conns_[id] = std::make_unique<Conn>();
  conns_[id]->authenticated = options_.token.empty();
}

bool Core::partial(int id) const {
  const Conn* c = find(id);
  return c != nullptr && c->pos < c->in.size();
}

void Core::close(int id) {
  Conn* c = find(id);
  if (c == nullptr) return;
  cancel_wait(id, *c);
  for (const auto& key : c->watching) unlist(watchers_, key, id);
  conns_[id].reset();
}

void Core::append(Conn& c, std::string_view bytes) {
  if (c.pos == c.in.size()) {
    c.in.clear();
    c.pos = 0;
    // A big value came through once: do not keep its buffer for the connection's life.
    if (c.in.capacity() > (std::size_t{1} << 20)) std::string().swap(c.in);
  } else if (c.pos > 0 && c.pos >= c.in.size() / 2) {
    c.in.erase(0, c.pos);  // `need` counts from pos: unchanged
    c.pos = 0;
  }
  std::size_t want = c.in.size() + bytes.size();
  if (c.in.capacity() < want) {
    // Geometric growth, with huge pages advised for big values before their first touch.
    c.in.reserve(std::max(want, 2 * c.in.capacity()));
    detail::advise_huge_pages(c.in.data(), c.in.capacity());
  }
  c.in.append(bytes);
}

std::optional<Core::Drop> Core::receive(int id, std::string_view bytes) {
  Conn* cp = find(id);
  DTRAIN_ASSERT(cp != nullptr, "store connection " + std::to_string(id) + " is not open");
  Conn& c = *cp;
  append(c, bytes);
  for (;;) {
    std::size_t available = c.in.size() - c.pos;
    if (available == 0 || available < c.need) break;
    auto limit = c.authenticated ? UINT64_MAX : options_.max_unauthenticated_request;
    auto d =
        wire::decode_request(std::string_view(c.in).substr(c.pos), c.protocol, request_, limit);
    if (d.status == wire::Decoded::Status::NEED_MORE) {
      c.need = d.need;
      break;
    }
    if (d.status == wire::Decoded::Status::ERROR) return Drop{std::move(d.error), true};
    c.pos += d.consumed;
    c.need = 0;
    c.protocol = request_.protocol;
    if (auto drop = serve(id, c, request_)) return drop;
  }
  if (c.pos == c.in.size()) {
    c.in.clear();
    c.pos = 0;
  }
  return std::nullopt;
}

bool Core::exists(const std::string& key) const {
  if (data_.count(key) > 0) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void Core::cancel_wait(int id, Conn& c) {
  for (const auto& key : c.awaiting) unlist(waiting_, key, id);
  c.awaiting.clear();
  c.missing = 0;
}

void Core::wake_waiters(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  std::vector<int> ids = std::move(it->second);
  waiting_.erase(it);
  for (int id : ids) {
    Conn* c = find(id);
    if (c == nullptr || c->missing == 0) continue;
    if (--c->missing == 0) {
      c->awaiting.clear();  // every key it waited for was woken, and so unlisted
      send_(id, Encoder().value(wire::kStopWaiting).take());
    }
  }
}

// A queue item goes to one waiter: the first whose last awaited key this was.
void Core::wake_one_waiter(const std::string& key) {
  auto it = waiting_.find(key);
  if (it == waiting_.end()) return;
  for (int id : it->second) {
    Conn* c = find(id);
    if (c == nullptr || c->missing != 1) continue;
    cancel_wait(id, *c);  // unlists it (it may invalidate `it`: return right after)
    send_(id, Encoder().value(wire::kStopWaiting).take());
    return;
  }
}

void Core::notify_watchers(const std::string& key, std::uint8_t type, const std::string& old_value,
                           const std::string& new_value) {
  auto it = watchers_.find(key);
  if (it == watchers_.end()) return;
  Encoder update;
  update.value(type).bytes(key).bytes(old_value).bytes(new_value);
  for (int id : it->second) send_(id, update.str());
}

void Core::do_set(const std::string& key, std::string value) {
  auto it = data_.find(key);
  bool created = it == data_.end();
  std::string old_value = created ? std::string() : std::move(it->second);
  std::string& slot = data_[key];
  slot = std::move(value);
  wake_waiters(key);
  notify_watchers(key, created ? wire::kKeyCreated : wire::kKeyUpdated, old_value, slot);
}

std::optional<Core::Drop> Core::serve(int id, Conn& c, wire::Request& r) {
  auto& args = r.args;
  auto reply = [&](Encoder& e) { send_(id, e.take()); };
  if (!c.authenticated && r.op != Op::VALIDATE && r.op != Op::AUTH) {
    return Drop{
        "it did not prove the store token before its first request (this store needs "
        "the job's --store-token / DTRAIN_STORE_TOKEN)",
        true};
  }
  switch (r.op) {
    case Op::SET:
      do_set(args[0], std::move(args[1]));
      return std::nullopt;
    case Op::COMPARE_SET: {
      const std::string& key = args[0];
      const std::string& expected = args[1];
      std::string& desired = args[2];
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (!expected.empty()) {
          // c10d answers `expected` for a missing key (its own TODO calls this "lying");
          // PyTorch callers compare against it, so we must too.
          send_(id, Encoder().bytes(expected).take());
          return std::nullopt;
        }
        data_[key] = desired;
        // c10d does not wake waiters here, which leaves a wait() on a key created by
        // compare_set hanging; waking them is the only difference a client can observe.
        wake_waiters(key);
        notify_watchers(key, wire::kKeyCreated, expected, desired);
        send_(id, Encoder().bytes(desired).take());
        return std::nullopt;
      }
      if (it->second == expected) {
        std::string old_value = std::exchange(it->second, std::move(desired));
        notify_watchers(key, wire::kKeyUpdated, old_value, it->second);
      }
      send_(id, Encoder().bytes(it->second).take());
      return std::nullopt;
    }
    case Op::GET: {
      auto it = data_.find(args[0]);
      // Clients WAIT before GET. A missing key anyway: PyTorch 1.x's daemon drops the
      // client, 2.x's answers an empty value; each client gets what its PyTorch does.
      if (it == data_.end() && r.protocol == Protocol::V1) {
        return Drop{"GET of missing key " + args[0], false};
      }
      send_(id, Encoder().bytes(it == data_.end() ? std::string_view() : it->second).take());
      return std::nullopt;
    }
    case Op::ADD: {
      const std::string& key = args[0];
      auto it = data_.find(key);
      bool created = it == data_.end();
      std::string old_value = created ? std::string() : it->second;
      auto value = static_cast<std::uint64_t>(r.number);
      if (!created) {
        // c10d reads the old value with std::stoll and drops the client if it is no number.
        try {
          value += static_cast<std::uint64_t>(std::stoll(old_value));
        } catch (const std::exception&) {
          return Drop{"ADD to key " + key + ", whose value is not a number", false};
        }
      }
      // Wraps around at 2^63 instead of overflowing (undefined in C++).
      auto sum = static_cast<std::int64_t>(value);
      std::string& slot = data_[key];
      slot = std::to_string(sum);
      send_(id, Encoder().value(sum).take());
      wake_waiters(key);
      notify_watchers(key, created ? wire::kKeyCreated : wire::kKeyUpdated, old_value, slot);
      return std::nullopt;
    }
    case Op::CHECK: {
      bool all = std::all_of(args.begin(), args.end(), [&](const auto& k) { return exists(k); });
      send_(id, Encoder().value(all ? wire::kReady : wire::kNotReady).take());
      return std::nullopt;
    }
    case Op::WAIT: {
      cancel_wait(id, c);  // a client waits for one set of keys at a time
      for (auto& key : args) {
        if (!exists(key)) {
          waiting_[key].push_back(id);
          c.awaiting.push_back(std::move(key));
          ++c.missing;
        }
      }
      if (c.missing == 0) send_(id, Encoder().value(wire::kStopWaiting).take());
      return std::nullopt;
    }
    case Op::GETNUMKEYS:
      send_(id, Encoder().value(static_cast<std::int64_t>(data_.size())).take());
      return std::nullopt;
    case Op::WATCH_KEY:
      watchers_[args[0]].push_back(id);
      c.watching.push_back(std::move(args[0]));
      send_(id, Encoder().value(wire::kCallbackRegistered).take());
      return std::nullopt;
    case Op::DELETE_KEY: {
      auto it = data_.find(args[0]);
      std::int64_t deleted = 0;
      if (it != data_.end()) {
        std::string old_value = std::move(it->second);
        data_.erase(it);
        deleted = 1;
        notify_watchers(args[0], wire::kKeyDeleted, old_value, std::string());
      }
      send_(id, Encoder().value(deleted).take());
      return std::nullopt;
    }
    case Op::APPEND: {
      const std::string& key = args[0];
      auto it = data_.find(key);
      bool created = it == data_.end();
      if (created) {
        data_.emplace(key, args[1]);
      } else {
        it->second += args[1];
      }
      wake_waiters(key);
      // c10d sends an empty "old value" and the appended bytes as the "new value".
      notify_watchers(key, created ? wire::kKeyCreated : wire::kKeyAppended, std::string(),
                      args[1]);
      return std::nullopt;
    }
    case Op::MULTI_GET: {
      Encoder out;
      for (const auto& key : args) {
        auto it = data_.find(key);
        if (it == data_.end() && r.protocol == Protocol::V1) {
          return Drop{"MULTI_GET of missing key " + key, false};
        }
        out.bytes(it == data_.end() ? std::string_view() : it->second);
      }
      reply(out);
      return std::nullopt;
    }
    case Op::MULTI_SET:
      for (std::size_t i = 0; i + 1 < args.size(); i += 2) do_set(args[i], std::move(args[i + 1]));
      return std::nullopt;
    case Op::CANCEL_WAIT:
      cancel_wait(id, c);
      send_(id, Encoder().value(wire::kWaitCanceled).take());
      return std::nullopt;
    case Op::VALIDATE:
      // The opening one decided the protocol; a later one is harmless if it still carries
      // the magic number.
      if (static_cast<std::uint32_t>(r.number) != wire::kValidationMagic) {
        return Drop{"it sent VALIDATE with a wrong magic number", true};
      }
      return std::nullopt;
    case Op::PING:
      // The client checks that its nonce comes back.
      send_(id, Encoder().value(static_cast<std::uint32_t>(r.number)).take());
      return std::nullopt;
    case Op::QUEUE_PUSH:
      queues_[args[0]].push_back(std::move(args[1]));
      wake_one_waiter(args[0]);
      return std::nullopt;
    case Op::QUEUE_POP: {
      // The length before the pop, then the item if there was one (clients WAIT first).
      Encoder out;
      auto it = queues_.find(args[0]);
      if (it == queues_.end()) {
        out.value(std::int64_t{0});
      } else {
        out.value(static_cast<std::int64_t>(it->second.size()));
        out.bytes(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      reply(out);
      return std::nullopt;
    }
    case Op::QUEUE_LEN: {
      auto it = queues_.find(args[0]);
      send_(id, Encoder()
                    .value(static_cast<std::int64_t>(it == queues_.end() ? 0 : it->second.size()))
                    .take());
      return std::nullopt;
    }
    case Op::LIST_KEYS: {
      Encoder out;
      out.value(static_cast<std::int64_t>(data_.size()));
      for (const auto& [key, value] : data_) out.bytes(key);
      reply(out);
      return std::nullopt;
    }
    case Op::AUTH: {
      if (options_.token.empty()) {
        send_(id, Encoder().value(wire::kAuthNoTokenHere).take());
        return Drop{"it sent a store token, but this store was started without one", true};
      }
      if (!same_token(args[0], options_.token)) {
        send_(id, Encoder().value(wire::kAuthWrongToken).take());
        return Drop{"it sent a wrong store token", true};
      }
      c.authenticated = true;
      send_(id, Encoder().value(wire::kAuthAccepted).take());
      return std::nullopt;
    }
    case Op::UNKNOWN:
      break;
  }
  DTRAIN_ASSERT(false, "store request op " + std::to_string(static_cast<int>(r.op)) +
                           " decoded but not served");
  return std::nullopt;
}

}  // namespace dtrain::store
