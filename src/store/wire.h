// The TCPStore wire format (both protocols, include/dtrain/store.h has the tables): one
// encoder for requests and replies, and the server's request decoder.
//
// The decoder is incremental and never trusts a length: it reads a request from the front
// of whatever bytes have arrived, says how many more it needs when they are not all there,
// and allocates only for bytes that did arrive. So the server can keep thousands of
// connections on one thread, each with half a request buffered, and a client that promises
// 2^63 bytes costs nothing until it sends them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::store::wire {

// What a request asks for, whichever protocol numbered it on the wire.
enum class Op : std::uint8_t {
  SET,
  COMPARE_SET,
  GET,
  ADD,
  CHECK,
  WAIT,
  GETNUMKEYS,
  WATCH_KEY,
  DELETE_KEY,
  APPEND,
  MULTI_GET,
  MULTI_SET,
  CANCEL_WAIT,
  VALIDATE,
  PING,
  QUEUE_PUSH,
  QUEUE_POP,
  QUEUE_LEN,
  LIST_KEYS,
  AUTH,  // dtrain's own (v2 only): the store token, see store.h
  UNKNOWN,
};

// A connection speaks one protocol, told by its first request: v2 clients (PyTorch 2.x)
// open with VALIDATE + the magic number; v1 clients (PyTorch 1.x) start with a query.
enum class Protocol : std::uint8_t { UNKNOWN, V1, V2 };

constexpr std::uint32_t kValidationMagic = 0x3C85F7CE;
// AUTH's code: far above v2's last query (LIST_KEYS = 17), so a future PyTorch query does
// not collide with it.
constexpr std::uint8_t kAuthCode = 0xD7;

constexpr std::uint8_t kReady = 0, kNotReady = 1;            // CHECK
constexpr std::uint8_t kStopWaiting = 0, kWaitCanceled = 1;  // WAIT, CANCEL_WAIT
constexpr std::uint8_t kKeyUpdated = 0, kKeyCreated = 1, kKeyDeleted = 2, kCallbackRegistered = 3,
                       kKeyAppended = 4;  // WATCH_KEY
// AUTH's one-byte answer. On anything but kAuthAccepted the server closes the connection.
constexpr std::uint8_t kAuthAccepted = 0, kAuthWrongToken = 1, kAuthNoTokenHere = 2;

// The op a request byte means in protocol p (UNKNOWN if none). REQUIRES: p is V1 or V2.
Op op_of(Protocol p, std::uint8_t code);
// The byte that sends op in protocol p. REQUIRES: p is V1 or V2 and the op exists there
// (VALIDATE, PING, QUEUE_*, LIST_KEYS and AUTH are v2 only; WATCH_KEY v1 only).
std::uint8_t code_of(Protocol p, Op op);
// "PyTorch 2.x (v2)" / "PyTorch 1.x (v1)".
const char* protocol_name(Protocol p);

// Builds one request or reply (or one watch update) so it goes out in a single send.
// Numbers in host byte order (little-endian on every platform PyTorch ships), strings as
// u64 length + bytes, as c10d's tcputil does.
class Encoder {
 public:
  template <typename T>
  Encoder& value(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
    return *this;
  }
  Encoder& bytes(std::string_view s);
  // u64 count, then each key with `prefix` in front.
  Encoder& keys(const std::vector<std::string>& keys, std::string_view prefix = {});
  const std::string& str() const { return out_; }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// One decoded request. `args` holds its strings in wire order (SET: key, value;
// COMPARE_SET: key, expected, desired; CHECK/WAIT/MULTI_GET: the keys; MULTI_SET: key, value,
// key, value, ...; AUTH: the token); `number` the integer it carries (ADD's delta,
// VALIDATE's magic, PING's nonce).
struct Request {
  Op op = Op::UNKNOWN;
  std::uint8_t code = 0;                  // the byte on the wire
  Protocol protocol = Protocol::UNKNOWN;  // the protocol it was decoded in
  std::vector<std::string> args;
  std::int64_t number = 0;
};

struct Decoded {
  enum class Status { NEED_MORE, COMPLETE, ERROR } status = Status::NEED_MORE;
  // COMPLETE: bytes the request took from the front of the input.
  std::size_t consumed = 0;
  // NEED_MORE: the input must hold at least this many bytes before decoding again can get
  // further (a lower bound; saturates instead of overflowing).
  std::uint64_t need = 0;
  // ERROR: what was wrong, for the line that names the client ("its first request has type
  // 238, which is neither ...").
  std::string error;
};

// Decodes the request at the front of `in` for a connection that speaks `protocol` so far
// (UNKNOWN before its first request; on COMPLETE, out.protocol says which it turned out to
// be). A request longer than `max_request` bytes is an ERROR as soon as its lengths say
// so. Pure: no state, no I/O; allocation bounded by in.size().
Decoded decode_request(std::string_view in, Protocol protocol, Request& out,
                       std::uint64_t max_request = UINT64_MAX);

}  // namespace dtrain::store::wire
