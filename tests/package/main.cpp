// Uses the installed headers and libraries of both targets: the env contract and store from
// dtrain::core, init_process_group from dtrain::dtrain (over file:// with one rank). The
// umbrella header, as a user's program includes it, compiles with the standard the package
// asks for.
#include <dtrain/dtrain.h>
#include <dtrain/env.h>
#include <dtrain/process_group.h>
#include <dtrain/store.h>

#include <cstdio>
#include <filesystem>

int main(int argc, char** argv) {
  auto server = dtrain::store::StoreServer::start({});
  auto client = dtrain::store::StoreClient::connect("127.0.0.1", server->port(), {});
  client->set("k", "v");
  std::string path = std::filesystem::temp_directory_path() /
                     ("dtrain_consumer_" + std::to_string(server->port()));
  std::filesystem::remove(path);
  auto pg =
      dtrain::init_process_group({.init_method = "file://" + path, .world_size = 1, .rank = 0});
  pg->barrier();
  std::filesystem::remove(path);
  bool ok = client->get("k") == "v" && pg->world_size() == 1;
  std::printf("consumer: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
