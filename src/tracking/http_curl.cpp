#include <curl/curl.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "dtrain/error.h"
#include "tracking/http.h"

namespace dtrain::mlflow::detail {

namespace {

std::once_flag curl_once;

size_t collect(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

}  // namespace

HttpResponse http_request(const std::string& method, const std::string& url,
                          const std::string& body, std::chrono::milliseconds timeout) {
  std::call_once(curl_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> h(curl_easy_init(), curl_easy_cleanup);
  if (!h) throw NetworkError("mlflow: curl_easy_init failed");
  HttpResponse out;
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)> hguard(headers, curl_slist_free_all);
  curl_easy_setopt(h.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(h.get(), CURLOPT_CUSTOMREQUEST, method.c_str());
  if (method != "GET") {
    curl_easy_setopt(h.get(), CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h.get(), CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  curl_easy_setopt(h.get(), CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &out.body);
  curl_easy_setopt(h.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(timeout.count()));
  curl_easy_setopt(h.get(), CURLOPT_CONNECTTIMEOUT_MS,
                   std::min<long>(2000, static_cast<long>(timeout.count())));
  curl_easy_setopt(h.get(), CURLOPT_NOSIGNAL, 1L);
  CURLcode rc = curl_easy_perform(h.get());
  if (rc != CURLE_OK)
    throw NetworkError(std::string(curl_easy_strerror(rc)) + " (" + method + " " + url + ")");
  curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &out.status);
  return out;
}

}  // namespace dtrain::mlflow::detail
