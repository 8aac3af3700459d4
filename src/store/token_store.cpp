#include "store/token_store.h"

#include <torch/version.h>

#include <utility>

#include "dtrain/error.h"

namespace dtrain::store {

namespace {

std::string text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

}  // namespace

TokenStore::TokenStore(std::string host, std::uint16_t port, std::string token,
                       std::chrono::milliseconds timeout)
    : c10d::Store(timeout), host_(std::move(host)), port_(port), token_(std::move(token)) {
  StoreClient::Options options;
  options.connect_timeout = timeout;
  options.timeout = timeout;
  options.token = token_;
  client_ = StoreClient::connect(host_, port_, options);
}

void TokenStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard lock(mutex_);
  client_->set(key, text(value));
}

std::vector<uint8_t> TokenStore::compareSet(const std::string& key,
                                            const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  std::lock_guard lock(mutex_);
  return bytes(client_->compare_set(key, text(expected), text(desired)));
}

std::vector<uint8_t> TokenStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard lock(mutex_);
  return bytes(client_->get(key));
}

int64_t TokenStore::add(const std::string& key, int64_t value) {
  std::lock_guard lock(mutex_);
  return client_->add(key, value);
}

bool TokenStore::deleteKey(const std::string& key) {
  std::lock_guard lock(mutex_);
  return client_->delete_key(key);
}

bool TokenStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return client_->check(keys);
}

int64_t TokenStore::getNumKeys() {
  std::lock_guard lock(mutex_);
  return client_->num_keys();
}

void TokenStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TokenStore::wait(const std::vector<std::string>& keys,
                      const std::chrono::milliseconds& timeout) {
  std::lock_guard lock(mutex_);
  if (!client_->wait(keys, timeout)) {
    std::string names;
    for (const auto& k : keys) names += (names.empty() ? "'" : ", '") + k + "'";
    throw TimeoutError("store key(s) " + names + " did not appear within " +
                       std::to_string(timeout.count()) + " ms (store at " + host_ + ":" +
                       std::to_string(port_) +
                       "); the process that should set them may have failed or not started");
  }
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Store> TokenStore::clone() {
  return c10::make_intrusive<TokenStore>(host_, port_, token_, timeout_);
}
#endif

}  // namespace dtrain::store
