// One HTTP request with a JSON body, for the MLflow REST client: libcurl where the build found
// it (http_curl.cpp), else an error that says so (http_none.cpp; file:// tracking still works).
#pragma once

#include <chrono>
#include <string>

namespace dtrain::mlflow::detail {

struct HttpResponse {
  long status = 0;  // the HTTP status code
  std::string body;
};

// Sends `method` `url` with `body` (ignored for GET) as application/json and returns the reply
// whatever its status. Gives up after `timeout` (connecting: at most 2 s of it).
// Throws NetworkError when no reply came (refused, timed out, DNS), naming the request.
HttpResponse http_request(const std::string& method, const std::string& url,
                          const std::string& body, std::chrono::milliseconds timeout);

}  // namespace dtrain::mlflow::detail
