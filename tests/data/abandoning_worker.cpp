// A rank that reads a table with the shared cache (on: `dtrain run` says LOCAL_WORLD_SIZE 2)
// and exits without any clean-up (_Exit: no destructors), as a killed or aborted rank would:
// the shared entries stay for `dtrain run` to sweep. Prints how many entries of this user it
// saw in /dev/shm before leaving.
//
//     dtrain run --nproc-per-node 2 abandoning_worker parquet:DIR
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/shared_files.h"
#include "dtrain/data_reader.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: abandoning_worker parquet:DIR\n");
    return 2;
  }
  dtrain::data::Reader reader(dtrain::data::Table::open(argv[1]),
                              {.columns = {{.name = "id", .dtype = torch::kLong}}});
  int64_t rows = 0;
  while (auto b = reader.next()) rows += b->rows;
  int entries = 0;
  const std::string stem = dtrain::detail::data_cache_stem();
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm"))
    entries += f.path().filename().string().rfind(stem, 0) == 0;
  std::printf("rows %lld entries %d\n", static_cast<long long>(rows), entries);
  std::fflush(stdout);
  std::_Exit(0);
}
