// What an MLflow server (or whatever answers at the tracking URI) sends back, read as the
// REST client reads it (tracking/store.h): experiment ids and run info.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "tracking/store.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string response(reinterpret_cast<const char*>(data), size);
  using namespace dtrain::mlflow::detail;
  dtrain::fuzz::refused_properly([&] { experiment_id_of_created(response); });
  dtrain::fuzz::refused_properly([&] { experiment_id_of_found(response); });
  dtrain::fuzz::refused_properly([&] { run_info_of(response, "runs/create", "7"); });
  dtrain::fuzz::refused_properly([&] { run_info_of(response, "runs/get", ""); });
  return 0;
}
