// A c10d::Store over dtrain's StoreClient: what a C++ worker's init_process_group uses instead
// of c10d::TCPStore when the job's store requires a token (DTRAIN_STORE_TOKEN, include/
// dtrain/store.h), since c10d's client cannot send one. Same keys on the wire as c10d's
// TCPStore ("/" + key), so workers of one job meet however they connected.
//
// Thread-safe: one connection, one request at a time (c10d's TCPStore serialises the same
// way); a wait() holds the connection until it returns.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/store.h"

namespace dtrain::store {

class TokenStore : public c10d::Store {
 public:
  // Connects (retrying up to `timeout`) and proves `token`. Throws what StoreClient::connect
  // throws (StoreAuthError for a refused token).
  TokenStore(std::string host, std::uint16_t port, std::string token,
             std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  // Waits for the key up to the store's timeout. Throws TimeoutError naming it.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  // Throws TimeoutError naming the keys when they did not all appear in time.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;
#if TORCH_VERSION_MAJOR >= 2
  // Another connection with the same address and token.
  c10::intrusive_ptr<c10d::Store> clone() override;
#endif

 private:
  std::string host_;
  std::uint16_t port_;
  std::string token_;
  std::mutex mutex_;
  std::unique_ptr<StoreClient> client_;
};

}  // namespace dtrain::store
