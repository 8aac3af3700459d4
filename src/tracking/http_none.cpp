// A build without libcurl (the configure step said so): the REST client cannot send anything.
#include "dtrain/error.h"
#include "tracking/http.h"

namespace dtrain::mlflow::detail {

HttpResponse http_request(const std::string& method, const std::string& url, const std::string&,
                          std::chrono::milliseconds) {
  throw UsageError("mlflow: cannot send " + method + " " + url +
                   ": this build of dtrain has no HTTP client (libcurl was not found when it was "
                   "configured); use a file:// tracking URI, or install libcurl's development "
                   "files (libcurl4-openssl-dev) and rebuild");
}

}  // namespace dtrain::mlflow::detail
