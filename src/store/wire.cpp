#include "store/wire.h"

#include <cstring>
#include <iterator>

#include "core/memory.h"
#include "dtrain/error.h"

namespace dtrain::store::wire {

namespace {

constexpr Op kV1[] = {Op::SET,       Op::COMPARE_SET, Op::GET,        Op::ADD,        Op::CHECK,
                      Op::WAIT,      Op::GETNUMKEYS,  Op::WATCH_KEY,  Op::DELETE_KEY, Op::APPEND,
                      Op::MULTI_GET, Op::MULTI_SET,   Op::CANCEL_WAIT};
constexpr Op kV2[] = {Op::VALIDATE,  Op::SET,       Op::COMPARE_SET, Op::GET,        Op::ADD,
                      Op::CHECK,     Op::WAIT,      Op::GETNUMKEYS,  Op::DELETE_KEY, Op::APPEND,
                      Op::MULTI_GET, Op::MULTI_SET, Op::CANCEL_WAIT, Op::PING,       Op::QUEUE_PUSH,
                      Op::QUEUE_POP, Op::QUEUE_LEN, Op::LIST_KEYS};

// Reads fields from the front of the input. A read that runs past what arrived returns
// false and leaves in `need` how long the input must be; a length that no request within
// the limit can have sets `too_long`.
class Cursor {
 public:
  Cursor(std::string_view in, std::uint64_t max) : in_(in), max_(max) {}

  template <typename T>
  bool value(T& v) {
    if (in_.size() - pos_ < sizeof(T)) {
      need_ = pos_ + sizeof(T);
      return false;
    }
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  // `n` more bytes must fit in the request; false (and too_long) if they cannot.
  bool fits(std::uint64_t n) {
    if (pos_ > max_ || n > max_ - pos_) {
      too_long_ = true;
      return false;
    }
    return true;
  }

  bool bytes(std::string& s, std::uint64_t n) {
    if (!fits(n)) return false;
    if (in_.size() - pos_ < n) {
      need_ = pos_ + n;
      return false;
    }
    s.assign(in_.data() + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return true;
  }

  bool bytes(std::string& s) {
    std::uint64_t n = 0;
    return value(n) && bytes(s, n);
  }

  // A string appended to `args`.
  bool arg(std::vector<std::string>& args) {
    std::uint64_t n = 0;
    if (!value(n) || !fits(n)) return false;
    // Only once all of it arrived: a half-sent value is not copied on every retry.
    if (in_.size() - pos_ < n) {
      need_ = pos_ + n;
      return false;
    }
    args.emplace_back();
    return bytes(args.back(), n);
  }

  // u64 count, then that many strings (each at least its 8-byte length).
  bool args(std::vector<std::string>& args, std::uint64_t per_item = 1) {
    std::uint64_t n = 0;
    if (!value(n)) return false;
    if (n > (UINT64_MAX / 8) / per_item || !fits(n * 8 * per_item)) {
      too_long_ = true;
      return false;
    }
    for (std::uint64_t i = 0; i < n * per_item; ++i) {
      if (!arg(args)) return false;
    }
    return true;
  }

  std::size_t pos() const { return pos_; }
  std::uint64_t need() const { return need_; }
  bool too_long() const { return too_long_; }

 private:
  std::string_view in_;
  std::uint64_t max_;
  std::size_t pos_ = 0;
  std::uint64_t need_ = 0;
  bool too_long_ = false;
};

Decoded error(std::string text) {
  Decoded d;
  d.status = Decoded::Status::ERROR;
  d.error = std::move(text);
  return d;
}

// The fields of `op` after its type byte.
bool body(Cursor& c, Op op, Request& out) {
  switch (op) {
    case Op::SET:
    case Op::APPEND:
    case Op::QUEUE_PUSH:
      return c.arg(out.args) && c.arg(out.args);
    case Op::COMPARE_SET:
      return c.arg(out.args) && c.arg(out.args) && c.arg(out.args);
    case Op::GET:
    case Op::WATCH_KEY:
    case Op::DELETE_KEY:
    case Op::QUEUE_POP:
    case Op::QUEUE_LEN:
    case Op::AUTH:
      return c.arg(out.args);
    case Op::ADD:
      return c.arg(out.args) && c.value(out.number);
    case Op::CHECK:
    case Op::WAIT:
    case Op::MULTI_GET:
      return c.args(out.args);
    case Op::MULTI_SET:
      return c.args(out.args, 2);
    case Op::VALIDATE:
    case Op::PING: {
      std::uint32_t v = 0;
      if (!c.value(v)) return false;
      out.number = v;
      return true;
    }
    case Op::GETNUMKEYS:
    case Op::CANCEL_WAIT:
    case Op::LIST_KEYS:
    case Op::UNKNOWN:
      return true;
  }
  return true;
}

}  // namespace

Op op_of(Protocol p, std::uint8_t code) {
  if (p == Protocol::V2) {
    if (code == kAuthCode) return Op::AUTH;
    return code < std::size(kV2) ? kV2[code] : Op::UNKNOWN;
  }
  return code < std::size(kV1) ? kV1[code] : Op::UNKNOWN;
}

std::uint8_t code_of(Protocol p, Op op) {
  if (p == Protocol::V2 && op == Op::AUTH) return kAuthCode;
  const Op* table = p == Protocol::V2 ? kV2 : kV1;
  std::size_t n = p == Protocol::V2 ? std::size(kV2) : std::size(kV1);
  for (std::size_t i = 0; i < n; ++i) {
    if (table[i] == op) return static_cast<std::uint8_t>(i);
  }
  DTRAIN_ASSERT(false, "store op " + std::to_string(static_cast<int>(op)) + " does not exist in " +
                           protocol_name(p));
  return 0;
}

const char* protocol_name(Protocol p) {
  return p == Protocol::V2 ? "PyTorch 2.x (v2)" : "PyTorch 1.x (v1)";
}

Encoder& Encoder::bytes(std::string_view s) {
  value<std::uint64_t>(s.size());
  if (s.size() >= (std::size_t{4} << 20)) {
    out_.reserve(out_.size() + s.size());
    detail::advise_huge_pages(out_.data(), out_.capacity());
  }
  out_ += s;
  return *this;
}

Encoder& Encoder::keys(const std::vector<std::string>& keys, std::string_view prefix) {
  value<std::uint64_t>(keys.size());
  for (const auto& k : keys) {
    value<std::uint64_t>(prefix.size() + k.size());
    out_.append(prefix);
    out_ += k;
  }
  return *this;
}

Decoded decode_request(std::string_view in, Protocol protocol, Request& out,
                       std::uint64_t max_request) {
  out.op = Op::UNKNOWN;
  out.code = 0;
  out.protocol = Protocol::UNKNOWN;
  out.args.clear();  // keeps its capacity for the next request
  out.number = 0;
  Cursor c(in, max_request);
  std::uint8_t code = 0;
  Decoded d;
  if (!c.value(code)) {
    d.need = 1;
    return d;
  }
  out.code = code;
  if (protocol == Protocol::UNKNOWN) {
    if (code != 0) {
      // Only v1 starts with a query other than byte 0; a byte v1 does not know either is
      // neither protocol (an HTTP probe, a newer PyTorch, ...).
      if (op_of(Protocol::V1, code) == Op::UNKNOWN) {
        return error("its first request has type " + std::to_string(code) +
                     ", which is neither a PyTorch 1.x (v1) nor a PyTorch 2.x (v2) TCPStore "
                     "request; is it a TCPStore client of a PyTorch version this dtrain does not "
                     "support, or not a TCPStore client at all?");
      }
      protocol = Protocol::V1;
    } else {
      // Byte 0 is v2's VALIDATE or v1's SET. VALIDATE carries the magic number; as the low
      // half of a SET's key length it would mean a ~1 GB key, which no store client sends.
      std::uint32_t magic = 0;
      if (!c.value(magic)) {
        d.need = c.need();
        return d;
      }
      Cursor again(in, max_request);
      again.value(code);
      c = again;
      protocol = magic == kValidationMagic ? Protocol::V2 : Protocol::V1;
    }
  }
  out.protocol = protocol;
  out.op = op_of(protocol, code);
  if (out.op == Op::UNKNOWN) {
    return error("it sent request type " + std::to_string(code) + ", unknown in the " +
                 protocol_name(protocol) + " TCPStore protocol it spoke so far");
  }
  if (!body(c, out.op, out)) {
    if (c.too_long()) {
      std::string limit = max_request == UINT64_MAX
                              ? std::string("2^64 bytes or more")
                              : "more than the " + std::to_string(max_request) +
                                    " bytes this store accepts from it";
      return error("it sent a " + std::string(protocol_name(protocol)) + " request of type " +
                   std::to_string(code) + " whose lengths add up to " + limit);
    }
    out.args.clear();
    d.need = c.need();
    return d;
  }
  d.status = Decoded::Status::COMPLETE;
  d.consumed = c.pos();
  return d;
}

}  // namespace dtrain::store::wire
