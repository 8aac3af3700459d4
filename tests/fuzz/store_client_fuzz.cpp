// StoreClient reading what a hostile or broken server answers: the input is the server's
// whole byte stream; the client makes every kind of request over a socketpair and must end
// in a dtrain error (or succeed), never read past a reply, allocate what a length claims
// before the bytes came, or hang (every read has a 50 ms timeout; the stream ends in EOF).
// Byte 0 picks the protocol (bit 0: v2) and the order of requests (the rest).
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

#include "fuzz/fuzz_support.h"
#include "store/client_over.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  // The client's requests go unread into fds[1]'s buffer: big enough for a few hundred.
  int buf = 1 << 20;
  ::setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  ::setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
  std::size_t off = 1;
  while (off < size) {
    ssize_t n = ::send(fds[1], data + off, size - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  ::shutdown(fds[1], SHUT_WR);  // the server says no more

  using dtrain::store::StoreClient;
  StoreClient::Options options;
  options.timeout = std::chrono::milliseconds(50);
  auto protocol =
      (data[0] & 1) ? StoreClient::Options::Protocol::v2 : StoreClient::Options::Protocol::v1;
  auto client =
      dtrain::store::client_over(dtrain::net::Socket(fds[0]), "fuzz:0", options, protocol);
  int order = data[0] >> 1;
  for (int i = 0; i < 9; ++i) {
    bool ok = dtrain::fuzz::refused_properly([&] {
      switch ((i + order) % 9) {
        case 0:
          client->set("k", "v");
          break;
        case 1:
          client->get("k");
          break;
        case 2:
          client->add("n", 3);
          break;
        case 3:
          client->compare_set("k", "v", "w");
          break;
        case 4:
          client->check({"a", "b"});
          break;
        case 5:
          client->wait({"a"}, std::chrono::milliseconds(1));
          break;
        case 6:
          client->delete_key("k");
          break;
        case 7:
          client->num_keys();
          break;
        case 8:
          client->wait({"a", "b"}, std::chrono::milliseconds(0));
          break;
      }
    });
    if (!ok) break;  // the client is unusable after an error (and says so)
  }
  ::close(fds[1]);
  return 0;
}
