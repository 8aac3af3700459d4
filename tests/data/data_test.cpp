// dtrain::data on tables real writers made (tests/data/make_tables.py: pyarrow's Parquet and
// delta-rs's Delta, with the rows those writers' own readers see): Parquet directories and
// Delta versions read exactly, the rank split (disjoint and complete for 1-4 ranks, epochs,
// DistributedSampler's row groups), an elastic restart at another world size, column
// conversion, and bad input as one clear error naming the file and the column.
#include <gtest/gtest.h>

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>

#include "core/shared_files.h"
#include "data/deletion_vector.h"
#include "data/written_tables.h"
#include "dtrain/data_reader.h"
#include "dtrain/data_table.h"
#include "dtrain/sampler.h"
#include "launcher/subprocess.h"

namespace {

using dtrain::data::Column;
using dtrain::data::DataError;
using dtrain::data::Reader;
using dtrain::data::ReaderOptions;
using dtrain::data::Table;
using namespace std::chrono_literals;

const std::string& tables() {
  static const std::string dir =
      dtrain::test::written_tables("tests/data/make_tables.py", "data_tables");
  return dir;
}

nlohmann::json expected() {
  return nlohmann::json::parse(dtrain::test::file_text(tables() + "/expected.json"));
}

std::vector<Column> id_column() { return {{.name = "id", .dtype = torch::kLong}}; }

// Every id a reader yields in one epoch, in order.
std::vector<int64_t> ids_of(Reader& r) {
  std::vector<int64_t> ids;
  while (auto b = r.next()) {
    auto t = b->at("id");
    ids.insert(ids.end(), t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  return ids;
}

std::vector<int64_t> sorted(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The message of the DataError `f` throws (fails the test when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no DataError";
  return "";
}

template <typename F>
std::string error_of_usage(F&& f) {
  try {
    f();
  } catch (const dtrain::UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError";
  return "";
}

TEST(DataTable, ParquetDirectorySkipsHiddenFilesAndListsRowGroups) {
  auto t = Table::open("parquet:" + tables() + "/parquet");
  EXPECT_EQ(t.format(), dtrain::data::TableFormat::kParquet);
  ASSERT_EQ(t.files().size(), 3u);  // _SUCCESS and _tmp/ skipped
  EXPECT_EQ(t.num_rows(), 240);
  // 100 rows in groups of 40, 57 in 7s, 83 in 25s.
  EXPECT_EQ(t.row_groups().size(), 3u + 9u + 4u);
  EXPECT_EQ(t.row_groups()[0].rows, 40);
  EXPECT_EQ(t.row_groups()[2].rows, 20);
  EXPECT_EQ(t.row_groups()[3].first, 100);
  EXPECT_FALSE(t.version());
  Reader r(
      t,
      {.columns = id_column(), .batch_size = 32, .num_replicas = 1, .rank = 0, .shuffle = false});
  auto ids = ids_of(r);
  std::vector<int64_t> all(240);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(ids, all);  // table order without shuffle
  EXPECT_EQ(r.steps_per_epoch(), 8);
}

TEST(DataReader, ColumnsConvertToTheAskedDtypeAndShape) {
  auto t = Table::open(tables() + "/parquet");  // a bare path: Parquet (no _delta_log)
  Reader r(t, {.columns = {{.name = "id", .dtype = torch::kLong},
                           {.name = "x", .dtype = torch::kDouble, .shape = {2, 2}},
                           {.name = "xv", .dtype = torch::kFloat, .shape = {4}, .key = "v"},
                           {.name = "label", .dtype = torch::kFloat}},
               .batch_size = 50,
               .num_replicas = 1,
               .rank = 0,
               .seed = 3});
  int64_t rows = 0;
  while (auto b = r.next()) {
    auto id = b->at("id");
    ASSERT_EQ(b->at("x").sizes(), (std::vector<int64_t>{b->rows, 2, 2}));
    ASSERT_EQ(b->at("x").scalar_type(), torch::kDouble);
    ASSERT_EQ(b->at("v").sizes(), (std::vector<int64_t>{b->rows, 4}));
    ASSERT_EQ(b->at("label").scalar_type(), torch::kFloat);
    auto want = id.unsqueeze(1).to(torch::kDouble) * 10 + torch::arange(4, torch::kDouble);
    EXPECT_TRUE(torch::equal(b->at("x").reshape({-1, 4}), want));
    EXPECT_TRUE(torch::equal(b->at("v"), want.to(torch::kFloat)));
    EXPECT_TRUE(torch::equal(b->at("label"), (id % 10).to(torch::kFloat)));
    rows += b->rows;
  }
  EXPECT_EQ(rows, 240);
  EXPECT_NE(error_of([&] { r.set_epoch(0), r.next()->at("nope"); }).find("has no tensor 'nope'"),
            std::string::npos);
}

// Every numeric type, as scalars and lists, reads as pyarrow wrote it - through Parquet's column
// reader (the direct path: int8-int64, uint8/uint16, float, double) and through Arrow's arrays
// (DTRAIN_DATA_DIRECT=0, and always for uint32 and bool), with the same tensors both ways.
TEST(DataReader, EveryNumericTypeReadsTheSameDirectlyAndThroughArrow) {
  struct Want {
    std::string name;
    std::vector<int64_t> shape;
    std::function<std::vector<double>(double)> values;  // of the row's id
  };
  const std::vector<Want> wants = {
      {"i8", {}, [](double i) { return std::vector<double>{i - 15}; }},
      {"i16", {}, [](double i) { return std::vector<double>{i * -1000}; }},
      {"i32", {}, [](double i) { return std::vector<double>{i * 70000}; }},
      {"u8", {}, [](double i) { return std::vector<double>{i * 8}; }},
      {"u16", {}, [](double i) { return std::vector<double>{i * 2000}; }},
      {"u32", {}, [](double i) { return std::vector<double>{i * 100000000}; }},
      {"f32", {}, [](double i) { return std::vector<double>{i * 0.5}; }},
      {"f64", {}, [](double i) { return std::vector<double>{i * 0.25}; }},
      {"b", {}, [](double i) { return std::vector<double>{std::fmod(i, 2) == 0 ? 1.0 : 0.0}; }},
      {"l_u8",
       {3},
       [](double i) {
         return std::vector<double>{i, i + 1, i + 2};
       }},
      {"l_i16",
       {2},
       [](double i) {
         return std::vector<double>{-i, i};
       }},
      {"l_i64",
       {2},
       [](double i) {
         return std::vector<double>{i * 1e10, i};
       }},
      {"l_f64", {1, 2}, [](double i) {
         return std::vector<double>{i * 1.5, -i};
       }}};
  auto read_all = [&] {
    std::vector<Column> columns = id_column();
    for (const auto& w : wants)
      columns.push_back({.name = w.name, .dtype = torch::kDouble, .shape = w.shape});
    Reader r(Table::open(tables() + "/types"),
             {.columns = columns, .batch_size = 7, .num_replicas = 1, .rank = 0, .seed = 5});
    std::map<std::string, std::vector<torch::Tensor>> parts;
    while (auto b = r.next())
      for (const auto& [key, t] : b->tensors) parts[key].push_back(t);
    std::map<std::string, torch::Tensor> out;
    for (auto& [key, list] : parts) out[key] = torch::cat(list);
    return out;
  };
  ::unsetenv("DTRAIN_DATA_DIRECT");
  auto direct = read_all();
  ::setenv("DTRAIN_DATA_DIRECT", "0", 1);
  auto arrow = read_all();
  ::unsetenv("DTRAIN_DATA_DIRECT");
  ASSERT_EQ(direct.at("id").numel(), 30);
  EXPECT_TRUE(torch::equal(arrow.at("id"), direct.at("id")));
  for (const auto& w : wants) {
    SCOPED_TRACE(w.name);
    const auto& got = direct.at(w.name);
    std::vector<int64_t> shape{30};
    shape.insert(shape.end(), w.shape.begin(), w.shape.end());
    ASSERT_EQ(got.sizes(), shape);
    EXPECT_TRUE(torch::equal(got, arrow.at(w.name)));
    auto flat = got.reshape({30, -1});
    for (int64_t row = 0; row < 30; ++row) {
      const double id = static_cast<double>(direct.at("id")[row].item<int64_t>());
      auto want = w.values(id);
      ASSERT_EQ(flat.size(1), static_cast<int64_t>(want.size()));
      for (size_t k = 0; k < want.size(); ++k)
        EXPECT_EQ(flat[row][static_cast<int64_t>(k)].item<double>(), want[k]) << "row id " << id;
    }
  }
}

// DistributedSampler's split by row group, rows equalised: every rank the same steps and
// rows; with W dividing the row groups (16) the ranks are disjoint and complete; with 3
// ranks the row groups DistributedSampler pads with are the only overlap.
TEST(DataReader, RanksReadDisjointCompleteSharesAcrossEpochs) {
  auto t = Table::open("parquet:" + tables() + "/parquet");
  std::vector<int64_t> group_rows;
  for (const auto& g : t.row_groups()) group_rows.push_back(g.rows);
  for (bool shuffle : {false, true}) {
    for (int world = 1; world <= 4; ++world) {
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        std::map<int64_t, int> seen;  // id -> ranks that read it
        int64_t steps = -1, rows = -1;
        for (int rank = 0; rank < world; ++rank) {
          Reader r(t, {.columns = id_column(),
                       .batch_size = 16,
                       .num_replicas = world,
                       .rank = rank,
                       .shuffle = shuffle,
                       .seed = 7});
          r.set_epoch(epoch);
          auto ids = ids_of(r);
          if (steps < 0) steps = r.steps_per_epoch(), rows = r.num_samples();
          EXPECT_EQ(r.steps_per_epoch(), steps);
          EXPECT_EQ(static_cast<int64_t>(ids.size()), rows);
          // This rank's row groups are DistributedSampler's indices.
          dtrain::DistributedSampler s(
              static_cast<int64_t>(group_rows.size()),
              {.num_replicas = world, .rank = rank, .shuffle = shuffle, .seed = 7});
          s.set_epoch(epoch);
          const auto indices = s.indices();
          std::set<int64_t> groups(indices.begin(), indices.end()), mine;
          for (int64_t id : ids) {
            for (size_t g = 0; g < t.row_groups().size(); ++g)
              if (id >= t.row_groups()[g].first && id < t.row_groups()[g].first + group_rows[g])
                mine.insert(static_cast<int64_t>(g));
          }
          EXPECT_TRUE(std::includes(groups.begin(), groups.end(), mine.begin(), mine.end()));
          for (int64_t id : std::set<int64_t>(ids.begin(), ids.end())) seen[id]++;
        }
        ASSERT_EQ(seen.size(), 240u) << "world " << world << " epoch " << epoch;
        int64_t shared = 0;
        for (auto& [id, n] : seen) shared += n > 1;
        if (16 % world == 0) {
          EXPECT_EQ(shared, 0) << "world " << world;
          EXPECT_GE(rows * world, 240);  // the largest rank's rows; the others pad to it
        } else {
          // 18 padded slots for 16 groups: 2 groups read twice.
          EXPECT_GT(shared, 0);
          EXPECT_LE(shared, 80);
        }
      }
    }
  }
}

TEST(DataReader, ShuffleIsSeededPerEpochAndDropLastTruncates) {
  auto t = Table::open("parquet:" + tables() + "/parquet");
  auto epoch_ids = [&](int64_t epoch, uint64_t seed, bool drop_last = false) {
    Reader r(t, {.columns = id_column(),
                 .batch_size = 10,
                 .num_replicas = 2,
                 .rank = 1,
                 .seed = seed,
                 .drop_last = drop_last});
    r.set_epoch(epoch);
    return ids_of(r);
  };
  EXPECT_EQ(epoch_ids(1, 5), epoch_ids(1, 5));  // deterministic
  EXPECT_NE(epoch_ids(1, 5), epoch_ids(2, 5));  // reshuffled per epoch
  EXPECT_NE(epoch_ids(1, 5), epoch_ids(1, 6));
  // drop_last: every rank the smallest rank's rows, no repeats.
  auto kept = epoch_ids(0, 5, true);
  EXPECT_EQ(std::set<int64_t>(kept.begin(), kept.end()).size(), kept.size());
  EXPECT_LE(kept.size(), 120u);
}

// Elastic mode: each row once per epoch at any world size, and across a restart at another.
TEST(DataReader, ElasticRestartAtAnotherWorldSizeReadsEveryRowExactlyOnce) {
  auto t = Table::open("delta:" + tables() + "/delta");
  const auto want = expected()["delta"][std::to_string(*t.version())].get<std::vector<int64_t>>();
  for (int world = 1; world <= 4; ++world) {
    std::vector<int64_t> all;
    for (int rank = 0; rank < world; ++rank) {
      Reader r(t, {.columns = id_column(),
                   .batch_size = 8,
                   .num_replicas = world,
                   .rank = rank,
                   .elastic = true});
      r.set_epoch(1);
      auto ids = ids_of(r);
      all.insert(all.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(sorted(all), want) << "world " << world;
  }
  // 3 ranks read 3 steps, commit; 2 ranks go on from there, 1 step, commit; 4 finish.
  auto opts = [](int world, int rank) {
    return ReaderOptions{.columns = id_column(),
                         .batch_size = 8,
                         .num_replicas = world,
                         .rank = rank,
                         .seed = 11,
                         .elastic = true};
  };
  std::vector<int64_t> read;
  std::string position;
  for (int rank = 0; rank < 3; ++rank) {
    Reader r(t, opts(3, rank));
    r.set_epoch(2);
    for (int s = 0; s < 3; ++s) {
      auto b = r.next();
      ASSERT_TRUE(b);
      auto id = b->at("id");
      read.insert(read.end(), id.data_ptr<int64_t>(), id.data_ptr<int64_t>() + id.numel());
    }
    if (rank == 0) position = r.position();
    EXPECT_EQ(r.position(), position);  // every rank the same position
  }
  // The newest version has 3 row groups (96, 30 and 10 rows): one per rank, so 3 steps of 8
  // read 24 + 24 + 10 rows (the short rank's third batch has 2 rows).
  EXPECT_EQ(read.size(), 58u);
  std::string position2;
  for (int rank = 0; rank < 2; ++rank) {
    Reader r(t, opts(2, rank));
    r.restore(position);
    EXPECT_EQ(r.epoch(), 2);
    auto b = r.next();
    auto id = b->at("id");
    read.insert(read.end(), id.data_ptr<int64_t>(), id.data_ptr<int64_t>() + id.numel());
    position2 = r.position();
  }
  int64_t steps = -1;
  for (int rank = 0; rank < 4; ++rank) {
    Reader r(t, opts(4, rank));
    r.restore(position2);
    if (steps < 0) steps = r.steps_per_epoch();
    EXPECT_EQ(r.steps_per_epoch(), steps);  // ranks agree, empty batches at the end if need be
    auto ids = ids_of(r);
    read.insert(read.end(), ids.begin(), ids.end());
    EXPECT_EQ(nlohmann::json::parse(r.position())["remaining"].size(), 0u);
  }
  EXPECT_EQ(sorted(read), want);
  // A position of another table is refused.
  Reader other(Table::open("parquet:" + tables() + "/parquet"), opts(1, 0));
  EXPECT_NE(error_of([&] {
              other.restore(position);
            }).find("it was taken on a Delta table at version " + std::to_string(*t.version())),
            std::string::npos);
  EXPECT_NE(error_of([&] { other.restore("{not json"); }).find("malformed"), std::string::npos);
}

// The cache (ReaderOptions::cache_bytes): later epochs read the same rows in the same order as
// without it, in distributed and elastic mode and with a budget smaller than the table, and a
// batch changed in place never changes what a later epoch reads (batches never alias it).
TEST(DataReader, CachedEpochsReadTheSameRowsAsDecodedOnes) {
  auto t = Table::open("parquet:" + tables() + "/parquet");
  const int64_t row_bytes = 8;            // one int64 column
  for (int mode = 0; mode < 3; ++mode) {  // distributed + shuffle, without shuffle, elastic
    for (int64_t budget : {int64_t{1} << 30, 5 * 15 * row_bytes}) {
      for (int rank = 0; rank < 2; ++rank) {
        auto opts = [&](int64_t cache) {
          return ReaderOptions{.columns = id_column(),
                               .batch_size = 16,
                               .num_replicas = 2,
                               .rank = rank,
                               .shuffle = mode != 1,
                               .seed = 3,
                               .elastic = mode == 2,
                               .cache_bytes = cache};
        };
        Reader cached(t, opts(budget)), decoded(t, opts(0));
        for (int64_t epoch = 0; epoch < 4; ++epoch) {
          cached.set_epoch(epoch);
          decoded.set_epoch(epoch);
          std::vector<int64_t> got;
          while (auto b = cached.next()) {
            auto id = b->at("id");
            got.insert(got.end(), id.data_ptr<int64_t>(), id.data_ptr<int64_t>() + id.numel());
            id.fill_(-1);  // a training loop may change its batch in place
          }
          EXPECT_EQ(got, ids_of(decoded))
              << "mode " << mode << " budget " << budget << " rank " << rank << " epoch " << epoch;
        }
      }
    }
  }
}

// A fresh copy of the Parquet test table under the temporary directory, named `name`.
std::filesystem::path copy_of_parquet_table(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / (name + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::copy(tables() + "/parquet", dir, fs::copy_options::recursive);
  return dir;
}

// Truncates every Parquet file under `dir`: any later read of one fails naming it.
void spoil_parquet_files(const std::filesystem::path& dir) {
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().extension() == ".parquet") std::filesystem::resize_file(f.path(), 8);
}

// Proof that later epochs come from the cache: once the files are gone bad, a cached reader
// still reads its epoch and an uncached one fails naming the file.
TEST(DataReader, ACachedTableIsNotReadAgain) {
  namespace fs = std::filesystem;
  const fs::path dir = copy_of_parquet_table("dtrain-data-cache");
  auto t = Table::open("parquet:" + dir.string());
  auto opts = [](int64_t cache) {
    return ReaderOptions{.columns = id_column(),
                         .batch_size = 32,
                         .num_replicas = 1,
                         .rank = 0,
                         .cache_bytes = cache};
  };
  Reader cached(t, opts(1 << 20)), decoded(t, opts(0));
  const auto first = sorted(ids_of(cached));
  EXPECT_EQ(first.size(), 240u);
  spoil_parquet_files(dir);
  cached.set_epoch(1);
  EXPECT_EQ(sorted(ids_of(cached)), first);
  auto msg = error_of([&] { ids_of(decoded); });
  EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
  fs::remove_all(dir);
}

// The dtrain-data-<uid>-* files in /dev/shm now.
std::set<std::string> shared_files() {
  std::set<std::string> out;
  const std::string stem = dtrain::detail::data_cache_stem();
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm"))
    if (f.path().filename().string().rfind(stem, 0) == 0) out.insert(f.path().string());
  return out;
}

// Two ranks of a host share what they decode: once both read epoch 0, later epochs read no
// file (each rank meets row groups the other decoded), where a private cache would; the last
// Reader removes the entries; an entry that does not check out is decoded instead.
TEST(DataReader, RanksOfAHostShareWhatTheyDecode) {
  namespace fs = std::filesystem;
  const fs::path dir = copy_of_parquet_table("dtrain-data-shared");
  auto t = Table::open("parquet:" + dir.string());
  auto opts = [](int rank, bool share) {
    return ReaderOptions{.columns = id_column(),
                         .batch_size = 16,
                         .num_replicas = 2,
                         .rank = rank,
                         .seed = 9,
                         .cache_bytes = 1 << 20,
                         .share_cache = share};
  };
  Reader reference0(Table::open("parquet:" + tables() + "/parquet"), opts(0, false));
  Reader reference1(Table::open("parquet:" + tables() + "/parquet"), opts(1, false));
  const auto before = shared_files();
  {
    Reader r0(t, opts(0, true)), r1(t, opts(1, true)), private0(t, opts(0, false));
    EXPECT_EQ(ids_of(r0), ids_of(reference0));
    EXPECT_EQ(ids_of(r1), ids_of(reference1));
    ids_of(private0);
    std::set<std::string> made;
    for (const auto& f : shared_files())
      if (!before.count(f)) made.insert(f);
    EXPECT_EQ(made.size(), t.row_groups().size() + 1) << "an entry per row group and a lock";

    spoil_parquet_files(dir);
    for (int64_t epoch = 1; epoch < 3; ++epoch) {
      for (auto* r : {&r0, &r1, &reference0, &reference1}) r->set_epoch(epoch);
      EXPECT_EQ(ids_of(r0), ids_of(reference0)) << "epoch " << epoch;
      EXPECT_EQ(ids_of(r1), ids_of(reference1)) << "epoch " << epoch;
    }
    private0.set_epoch(1);
    auto msg = error_of([&] { ids_of(private0); });
    EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
  }
  for (const auto& f : shared_files()) EXPECT_TRUE(before.count(f)) << f << " was left behind";

  // Entries replaced by garbage (a new file renamed over each, as a writer would): decoded.
  copy_of_parquet_table("dtrain-data-shared");
  auto fresh = Table::open("parquet:" + dir.string());
  {
    Reader r0(fresh, opts(0, true)), r1(fresh, opts(1, true));
    ids_of(r0);
    ids_of(r1);
    for (const auto& f : shared_files()) {
      if (before.count(f) || f.find(".lock") != std::string::npos) continue;
      {
        std::ofstream bad(f + ".bad", std::ios::binary);
        bad << "DTRDATA1 but nothing after";
      }
      fs::rename(f + ".bad", f);
    }
    Reader late0(fresh, opts(0, true));
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      late0.set_epoch(epoch);
      reference0.set_epoch(epoch);
      EXPECT_EQ(ids_of(late0), ids_of(reference0)) << "epoch " << epoch;
    }
  }
  for (const auto& f : shared_files()) EXPECT_TRUE(before.count(f)) << f << " was left behind";
  fs::remove_all(dir);
}

// Ranks that die without clean-up (here: _Exit after an epoch with the shared cache) leave
// their entries in /dev/shm; `dtrain run` sweeps them once its workers are gone.
TEST(DataReader, DtrainRunSweepsTheSharedEntriesOfRanksThatDiedWithoutCleanUp) {
  const auto before = shared_files();
  auto r = dtrain::test::run_command({DTRAIN_BIN, "run", "--nproc-per-node", "2",
                                      ABANDONING_WORKER_BIN, "parquet:" + tables() + "/parquet"},
                                     {.timeout = 120s});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // Each rank read its share; the later one saw every row group's entry and the lock.
  Reader probe(Table::open("parquet:" + tables() + "/parquet"),
               {.columns = id_column(), .num_replicas = 2, .rank = 0});
  EXPECT_NE(r.out.find("rows " + std::to_string(probe.num_samples()) + " entries"),
            std::string::npos)
      << r.out << r.err;
  int seen = 0;
  for (size_t at = r.out.find("entries "); at != std::string::npos;
       at = r.out.find("entries ", at + 1))
    seen = std::max(seen, std::stoi(r.out.substr(at + 8)));
  EXPECT_GE(
      seen,
      static_cast<int>(Table::open("parquet:" + tables() + "/parquet").row_groups().size()) + 1)
      << r.out;
  for (const auto& f : shared_files()) EXPECT_TRUE(before.count(f)) << f << " was left behind";
}

// A column's transform runs on the decoding threads, on what was decoded (the cache keeps the
// values before it), may change the dtype, and fails the epoch with one clear error.
TEST(DataReader, TransformsRunOnTheDecodingThreadsAfterTheCache) {
  auto t = Table::open("parquet:" + tables() + "/parquet");
  std::mutex mu;
  std::set<std::string> threads;
  auto doubled = [&](const torch::Tensor& id) {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof name);
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(name);
    }
    return id.to(torch::kDouble).mul_(2);
  };
  for (int mode = 0; mode < 2; ++mode) {  // distributed, elastic (empty batches at the end)
    for (int64_t cache : {int64_t{0}, int64_t{1} << 20}) {
      auto opts = [&](bool transform) {
        auto columns = id_column();
        if (transform) columns[0].transform = doubled;
        return ReaderOptions{.columns = columns,
                             .batch_size = 16,
                             .num_replicas = 3,
                             .rank = 1,
                             .seed = 5,
                             .elastic = mode == 1,
                             .cache_bytes = cache};
      };
      Reader plain(t, opts(false)), transformed(t, opts(true));
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        plain.set_epoch(epoch);
        transformed.set_epoch(epoch);
        std::vector<double> got;
        while (auto b = transformed.next()) {
          const auto& x = b->at("id");
          ASSERT_EQ(x.scalar_type(), torch::kDouble) << "rows " << b->rows;
          ASSERT_EQ(x.size(0), b->rows);
          got.insert(got.end(), x.data_ptr<double>(), x.data_ptr<double>() + x.numel());
        }
        std::vector<double> want;
        for (int64_t id : ids_of(plain)) want.push_back(2.0 * static_cast<double>(id));
        EXPECT_EQ(got, want) << "mode " << mode << " cache " << cache << " epoch " << epoch;
      }
    }
  }
  EXPECT_EQ(threads.count("dtrain-data"), 1u);

  auto failing = [&](std::function<torch::Tensor(const torch::Tensor&)> f) {
    auto columns = id_column();
    columns[0].transform = std::move(f);
    Reader r(t, {.columns = columns, .num_replicas = 1, .rank = 0});
    return error_of([&] { ids_of(r); });
  };
  auto msg = failing(
      [](const torch::Tensor&) -> torch::Tensor { throw std::runtime_error("no pixels here"); });
  EXPECT_NE(msg.find("transform of column 'id' failed on row group"), std::string::npos) << msg;
  EXPECT_NE(msg.find(".parquet: no pixels here"), std::string::npos) << msg;
  msg = failing([](const torch::Tensor& id) { return id.narrow(0, 0, 1); });
  EXPECT_NE(msg.find("must map each row to one row"), std::string::npos) << msg;
}

// A column's preprocess runs once per decoded row group, before the cache (which keeps its
// output, shared or not), and must keep the dtype and shape.
TEST(DataReader, PreprocessRunsOncePerDecodedRowGroupBeforeTheCache) {
  auto t = Table::open("parquet:" + tables() + "/parquet");
  const auto groups = static_cast<int>(t.row_groups().size());
  std::atomic<int> calls{0};
  auto doubled = [&](const torch::Tensor& id) {
    ++calls;
    return id.mul_(2);  // in place: the tensor is its own
  };
  auto opts = [&](int rank, int64_t cache, bool share) {
    auto columns = std::vector<Column>{{.name = "id", .dtype = torch::kDouble}};
    columns[0].preprocess = doubled;
    return ReaderOptions{.columns = columns,
                         .batch_size = 16,
                         .num_replicas = 2,
                         .rank = rank,
                         .seed = 4,
                         .cache_bytes = cache,
                         .share_cache = share};
  };
  auto doubled_ids = [](Reader& r) {
    std::vector<double> got;
    while (auto b = r.next()) {
      auto x = b->at("id");
      got.insert(got.end(), x.data_ptr<double>(), x.data_ptr<double>() + x.numel());
    }
    return got;
  };
  auto want = [&](int rank, int64_t epoch) {
    Reader plain(t, {.columns = id_column(),
                     .batch_size = 16,
                     .num_replicas = 2,
                     .rank = rank,
                     .seed = 4,
                     .cache_bytes = 0});
    plain.set_epoch(epoch);
    std::vector<double> out;
    for (int64_t id : ids_of(plain)) out.push_back(2.0 * static_cast<double>(id));
    return out;
  };
  for (int64_t cache : {int64_t{0}, int64_t{1} << 20}) {
    for (bool share : {false, true}) {
      if (share && cache == 0) continue;
      calls = 0;
      Reader r0(t, opts(0, cache, share)), r1(t, opts(1, cache, share));
      for (int64_t epoch = 0; epoch < 4; ++epoch) {
        r0.set_epoch(epoch);
        r1.set_epoch(epoch);
        EXPECT_EQ(doubled_ids(r0), want(0, epoch)) << "cache " << cache << " epoch " << epoch;
        EXPECT_EQ(doubled_ids(r1), want(1, epoch)) << "cache " << cache << " epoch " << epoch;
      }
      if (cache == 0) {
        EXPECT_GE(calls.load(), 4 * groups) << "no cache: every epoch's pieces";
      } else if (share) {
        EXPECT_EQ(calls.load(), groups) << "shared: each row group once on the host";
      } else {
        EXPECT_GT(calls.load(), groups) << "private: a row group once per rank that reads it";
        EXPECT_LE(calls.load(), 2 * groups);
      }
    }
  }
  auto columns = std::vector<Column>{{.name = "id", .dtype = torch::kDouble}};
  columns[0].preprocess = [](const torch::Tensor& id) { return id.to(torch::kFloat); };
  Reader bad(t, {.columns = columns, .num_replicas = 1, .rank = 0});
  auto msg = error_of([&] { bad.next(); });
  EXPECT_NE(msg.find("preprocess of column 'id' returned Float"), std::string::npos) << msg;
  EXPECT_NE(msg.find("keeps the dtype and shape"), std::string::npos) << msg;
}

// The decoding threads are named dtrain-data and run thread_nice steps below the caller.
TEST(DataReader, DecodingThreadsAreNamedAndNiced) {
  auto t = Table::open("parquet:" + tables() + "/parquet");
  auto stat_nice = [](const std::string& task) {
    std::string stat = dtrain::test::file_text(task + "/stat");
    std::istringstream rest(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 19; ++i) rest >> field;  // field 19: nice
    return std::stoi(field);
  };
  const int own = stat_nice("/proc/thread-self");
  Reader r(t,
           {.columns = id_column(), .num_replicas = 1, .rank = 0, .threads = 3, .thread_nice = 7});
  ASSERT_TRUE(r.next());
  // The threads name and renice themselves first thing; give the last one a moment (5 s).
  int named = 0, niced = 0;
  for (int tries = 0; tries < 500 && niced < 3; ++tries) {
    if (tries) std::this_thread::sleep_for(10ms);
    named = niced = 0;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::string comm = dtrain::test::file_text(task.path().string() + "/comm");
      if (comm.rfind("dtrain-data", 0) != 0) continue;
      ++named;
      niced += stat_nice(task.path().string()) == std::min(own + 7, 19);
    }
  }
  EXPECT_EQ(named, 3);
  EXPECT_EQ(niced, 3);
  EXPECT_NE(error_of_usage([&] { Reader(t, {.columns = id_column(), .thread_nice = 20}); }), "");
  EXPECT_NE(error_of_usage([&] { Reader(t, {.columns = id_column(), .cache_bytes = -1}); }), "");
}

TEST(DeltaTable, EveryVersionHoldsExactlyTheRowsDeltaRsReads) {
  const auto e = expected();
  const std::string dir = tables() + "/delta";
  EXPECT_EQ(*Table::open("delta:" + dir).version(), e["delta_newest"].get<int64_t>());
  EXPECT_EQ(*Table::open(dir).version(), e["delta_newest"].get<int64_t>());  // auto: _delta_log
  for (const auto& [v, ids] : e["delta"].items()) {
    auto t = Table::open("delta:" + dir, {.version = std::stoll(v)});
    EXPECT_EQ(*t.version(), std::stoll(v));
    Reader r(t, {.columns = id_column(), .batch_size = 64, .num_replicas = 1, .rank = 0});
    EXPECT_EQ(sorted(ids_of(r)), ids.get<std::vector<int64_t>>()) << "version " << v;
  }
  // The checkpoint is at 3: versions after it start from it, those before replay commits.
  EXPECT_EQ(e["delta_checkpoint"].get<int64_t>(), 3);
  EXPECT_NE(error_of([&] {
              Table::open("delta:" + dir, {.version = 99});
            }).find("has no version 99: its newest is 6"),
            std::string::npos);
}

TEST(DeltaTable, PartitionColumnsComeFromTheLog) {
  auto t = Table::open("delta:" + tables() + "/delta_part");
  bool found = false;
  for (const auto& c : t.columns()) found |= c.name == "label" && c.partition;
  EXPECT_TRUE(found);
  Reader r(t, {.columns = {{.name = "id", .dtype = torch::kLong},
                           {.name = "label", .dtype = torch::kLong}},
               .batch_size = 7,
               .num_replicas = 1,
               .rank = 0});
  std::vector<int64_t> ids;
  while (auto b = r.next()) {
    EXPECT_TRUE(torch::equal(b->at("label"), b->at("id") % 10));
    auto id = b->at("id");
    ids.insert(ids.end(), id.data_ptr<int64_t>(), id.data_ptr<int64_t>() + id.numel());
  }
  EXPECT_EQ(sorted(ids), expected()["delta_part"].get<std::vector<int64_t>>());
}

// Column mapping, as Databricks turns it on to rename or drop columns: the files and the log's
// partitionValues name the columns by physical names ("name" mode) or Parquet field ids ("id"
// mode). The reader shows the table's own names and reads the rows delta-rs's engine reads.
TEST(DeltaTable, ColumnMappingByNameAndByIdReadsTheRowsDeltaRsReads) {
  for (const std::string key : {"delta_mapped", "delta_mapped_id"}) {
    SCOPED_TRACE(key);
    auto t = Table::open("delta:" + tables() + "/" + key);
    std::map<std::string, bool> columns;  // name -> partition
    for (const auto& c : t.columns()) columns[c.name] = c.partition;
    EXPECT_EQ(columns,
              (std::map<std::string, bool>{
                  {"id", false}, {"x", false}, {"name", false}, {"label", key == "delta_mapped"}}));
    Reader r(t, {.columns = {{.name = "id", .dtype = torch::kLong},
                             {.name = "label", .dtype = torch::kLong},
                             {.name = "x", .dtype = torch::kFloat, .shape = {4}}},
                 .batch_size = 16,
                 .num_replicas = 1,
                 .rank = 0});
    std::vector<std::vector<double>> got;
    while (auto b = r.next()) {
      auto id = b->at("id"), label = b->at("label"), x = b->at("x");
      for (int64_t i = 0; i < id.size(0); ++i) {
        std::vector<double> row = {static_cast<double>(id[i].item<int64_t>()),
                                   static_cast<double>(label[i].item<int64_t>())};
        for (int64_t j = 0; j < 4; ++j) row.push_back(x[i][j].item<float>());
        got.push_back(row);
      }
    }
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, expected()[key].get<std::vector<std::vector<double>>>());
  }
}

TEST(DeltaTable, AMissingCommitIsAnErrorNamingIt) {
  const std::string dir = tables() + "/delta_gap";
  // Version 2 needs commits 0-2 (no checkpoint before it): 2 is gone.
  auto msg = error_of([&] { Table::open("delta:" + dir, {.version = 2}); });
  EXPECT_NE(msg.find("missing the commit " + dir + "/_delta_log/00000000000000000002.json"),
            std::string::npos)
      << msg;
  // Version 1 and the newest (from the checkpoint at 3) do not need it.
  EXPECT_EQ(Table::open("delta:" + dir, {.version = 1}).num_rows(), 150);
  EXPECT_EQ(Table::open("delta:" + dir).num_rows(),
            static_cast<int64_t>(expected()["delta"]["6"].size()));
  EXPECT_NE(error_of([&] {
              Table::open("delta:" + tables() + "/parquet");
            }).find("is not a Delta table: it has no _delta_log"),
            std::string::npos);
}

// Deletion vectors (tests/data/make_tables.py writes them per the Delta protocol, as no writer
// here does; delta-rs's DataFusion reader applies them and gave the expected rows): inline,
// by uuid (two in one DV file, under a random prefix), by absolute path, a file deleted twice,
// a whole row group deleted, a checkpoint carrying them, and time travel across them.
std::vector<int64_t> ids_of_version(const Table& t, int world = 1, int rank = 0,
                                    bool elastic = false) {
  Reader r(t, {.columns = id_column(),
               .batch_size = 8,
               .num_replicas = world,
               .rank = rank,
               .seed = 5,
               .elastic = elastic});
  r.set_epoch(1);
  return ids_of(r);
}

TEST(DeltaDeletionVectors, EveryVersionHoldsExactlyTheRowsDeltaRsReads) {
  const auto e = expected();
  const std::string dir = tables() + "/delta_dv";
  // delta-rs gives a table with deletion vectors enabled the reader feature variantType too,
  // with no variant column: both are read.
  EXPECT_EQ(e["delta_dv_protocol"], nlohmann::json({"deletionVectors", "variantType"}));
  for (const auto& [v, ids] : e["delta_dv"].items()) {
    auto t = Table::open("delta:" + dir, {.version = std::stoll(v)});
    const auto want = ids.get<std::vector<int64_t>>();
    EXPECT_EQ(t.num_rows(), static_cast<int64_t>(want.size())) << "version " << v;
    EXPECT_EQ(sorted(ids_of_version(t)), want) << "version " << v;
  }
}

TEST(DeltaDeletionVectors, RowGroupsCountTheRowsLeft) {
  auto t = Table::open("delta:" + tables() + "/delta_dv");
  const auto groups = expected()["delta_dv_groups"];
  ASSERT_EQ(t.row_groups().size(), groups.size());
  int64_t first = 0, emptied = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& rg = t.row_groups()[g];
    EXPECT_EQ(rg.rows + rg.deleted, groups[g][0].get<int64_t>()) << "row group " << g;
    EXPECT_EQ(rg.deleted, groups[g][1].get<int64_t>()) << "row group " << g;
    EXPECT_EQ(rg.first, first);
    first += rg.rows;
    emptied += rg.rows == 0;
  }
  EXPECT_EQ(first, t.num_rows());
  EXPECT_EQ(emptied, 1);  // file 0's second row group is deleted whole
}

// Over 1-4 ranks, shuffled, two epochs: every row left is read, the ranks agree on the steps,
// and rows are read more than once only to pad the ranks to equal shares (DistributedSampler);
// in elastic mode exactly once, across a restart at another world size too.
TEST(DeltaDeletionVectors, RanksReadEveryRowLeftAndNoDeletedOne) {
  auto t = Table::open("delta:" + tables() + "/delta_dv");
  const auto want = expected()["delta_dv"]["6"].get<std::vector<int64_t>>();
  const std::set<int64_t> left(want.begin(), want.end());
  for (int world = 1; world <= 4; ++world) {
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::map<int64_t, int> reads;
      int64_t steps = -1, samples = -1;
      for (int rank = 0; rank < world; ++rank) {
        Reader r(t, {.columns = id_column(),
                     .batch_size = 8,
                     .num_replicas = world,
                     .rank = rank,
                     .seed = 3});
        r.set_epoch(epoch);
        for (int64_t id : ids_of(r)) reads[id]++;
        if (steps < 0) steps = r.steps_per_epoch(), samples = r.num_samples();
        EXPECT_EQ(r.steps_per_epoch(), steps);
        EXPECT_EQ(r.num_samples(), samples);
      }
      std::set<int64_t> seen;
      int64_t total = 0;
      for (auto [id, n] : reads) seen.insert(id), total += n;
      EXPECT_EQ(seen, left) << "world " << world << " epoch " << epoch;
      EXPECT_EQ(total, samples * world);  // each rank its num_samples(), padding included
      EXPECT_EQ(steps, (samples + 7) / 8);
    }
    std::vector<int64_t> all;
    for (int rank = 0; rank < world; ++rank) {
      auto ids = ids_of_version(t, world, rank, true);
      all.insert(all.end(), ids.begin(), ids.end());
    }
    EXPECT_EQ(sorted(all), want) << "elastic, world " << world;
  }
  // Elastic: 3 ranks read 2 steps, 2 ranks finish from their position.
  auto opts = [](int world, int rank) {
    return ReaderOptions{.columns = id_column(),
                         .batch_size = 8,
                         .num_replicas = world,
                         .rank = rank,
                         .seed = 9,
                         .elastic = true};
  };
  std::vector<int64_t> read;
  std::string position;
  for (int rank = 0; rank < 3; ++rank) {
    Reader r(t, opts(3, rank));
    for (int s = 0; s < 2; ++s) {
      auto id = r.next()->at("id");
      read.insert(read.end(), id.data_ptr<int64_t>(), id.data_ptr<int64_t>() + id.numel());
    }
    position = r.position();
  }
  for (int rank = 0; rank < 2; ++rank) {
    Reader r(t, opts(2, rank));
    r.restore(position);
    auto ids = ids_of(r);
    read.insert(read.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(sorted(read), want);
  // A position taken before the delete does not restore after it: other rows.
  Reader before(Table::open("delta:" + tables() + "/delta_dv", {.version = 2}), opts(1, 0));
  Reader after(t, opts(1, 0));
  EXPECT_NE(error_of([&] { after.restore(before.position()); }).find("taken at version 2"),
            std::string::npos);
}

// A position records the data it counts: at another Delta version with the same row counts (a
// deletion vector moved from row 3 to row 7, written as delta-rs reads it) it is refused, naming
// both versions and time travel; at its own version it restores, and at a version that changed
// no file; one written before dtrain recorded the data is checked by its counts only; renamed
// Parquet files are refused.
TEST(DataReader, APositionRestoresOnlyOnTheDataItWasTakenOn) {
  const std::string dir = tables() + "/delta_dv_moved";
  const auto want = expected()["delta_dv_moved"];
  const ReaderOptions opts{.columns = id_column(),
                           .batch_size = 5,
                           .num_replicas = 1,
                           .rank = 0,
                           .shuffle = false,
                           .elastic = true};
  Reader v1(Table::open("delta:" + dir, {.version = 1}), opts);
  auto first = v1.next()->at("id");
  std::vector<int64_t> read(first.data_ptr<int64_t>(), first.data_ptr<int64_t>() + first.numel());
  const std::string position = v1.position();
  EXPECT_EQ(nlohmann::json::parse(position)["table"]["version"], 1);

  Reader v2(Table::open("delta:" + dir), opts);
  ASSERT_EQ(*v2.table().version(), 2);
  ASSERT_EQ(v2.table().num_rows(), v1.table().num_rows());  // the counts cannot tell them apart
  const std::string msg = error_of([&] { v2.restore(position); });
  for (const std::string& part :
       {"taken at version 1 of the Delta table " + dir, std::string("differ from version 2"),
        std::string("Table::open(location, {.version = 1})")})
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  // An append (version 0 to 2: other counts too) names the versions as well.
  Reader v0(Table::open("delta:" + dir, {.version = 0}), opts);
  EXPECT_NE(error_of([&] { v2.restore(v0.position()); }).find("taken at version 0"),
            std::string::npos);

  // The same version number with other files (a log rewritten in place; here the position's
  // record says version 2 with version 1's files): time travel cannot help, so it says so.
  auto rewritten = nlohmann::json::parse(position);
  rewritten["table"]["version"] = 2;
  const std::string same = error_of([&] { v2.restore(rewritten.dump()); });
  EXPECT_NE(same.find("version 2 there now lists other files or deletion vectors"),
            std::string::npos)
      << same;
  EXPECT_EQ(same.find("differ from version 2"), std::string::npos) << same;

  // At its own version (time travel, the table being at 2 now): the rows version 1 left.
  Reader again(Table::open("delta:" + dir, {.version = 1}), opts);
  again.restore(position);
  auto rest = ids_of(again);
  read.insert(read.end(), rest.begin(), rest.end());
  EXPECT_EQ(sorted(read), want["1"].get<std::vector<int64_t>>());

  // A commit that changed only the protocol (delta_v2ck's version 1 adds a reader feature)
  // leaves the same files: the same data, restored.
  Reader ck0(Table::open("delta:" + tables() + "/delta_v2ck", {.version = 0}), opts);
  Reader ck1(Table::open("delta:" + tables() + "/delta_v2ck", {.version = 1}), opts);
  ck0.next();
  ck1.restore(ck0.position());
  EXPECT_EQ(ids_of(ck1).size(), 25u);  // 30 rows, 5 read

  // Written before positions recorded the data: no "table", the counts alone are checked.
  auto old = nlohmann::json::parse(position);
  old.erase("table");
  v2.restore(old.dump());
  EXPECT_EQ(ids_of(v2).size(), 14u);

  // Parquet: a file renamed (the same counts, other files) is refused; a copy of the
  // directory elsewhere is the same data.
  namespace fs = std::filesystem;
  const fs::path copy = copy_of_parquet_table("position-digest");
  const ReaderOptions popts{.columns = id_column(), .num_replicas = 1, .rank = 0, .elastic = true};
  Reader p1(Table::open("parquet:" + tables() + "/parquet"), popts);
  p1.next();
  const std::string ppos = p1.position();
  Reader(Table::open("parquet:" + copy.string()), popts).restore(ppos);
  fs::rename(copy / "part-00002.parquet", copy / "part-00003.parquet");
  Reader renamed(Table::open("parquet:" + copy.string()), popts);
  const std::string pmsg = error_of([&] { renamed.restore(ppos); });
  EXPECT_NE(pmsg.find("it was taken on 3 Parquet files"), std::string::npos) << pmsg;
  EXPECT_NE(pmsg.find("a file was added, removed or rewritten since"), std::string::npos) << pmsg;
  fs::remove_all(copy);
}

TEST(DeltaDeletionVectors, CachedAndSharedEpochsReadTheSameRows) {
  auto t = Table::open("delta:" + tables() + "/delta_dv");
  for (bool share : {false, true}) {
    auto opts = [&](int64_t cache) {
      return ReaderOptions{.columns = id_column(),
                           .batch_size = 8,
                           .num_replicas = 2,
                           .rank = 1,
                           .seed = 4,
                           .cache_bytes = cache,
                           .share_cache = share};
    };
    Reader cached(t, opts(int64_t{1} << 20)), decoded(t, opts(0));
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      cached.set_epoch(epoch);
      decoded.set_epoch(epoch);
      EXPECT_EQ(ids_of(cached), ids_of(decoded)) << "share " << share << " epoch " << epoch;
    }
  }
  // Another version of the table (other deletion vectors) never maps these entries.
  Reader v3(Table::open("delta:" + tables() + "/delta_dv", {.version = 3}),
            {.columns = id_column(),
             .num_replicas = 1,
             .rank = 0,
             .cache_bytes = int64_t{1} << 20,
             .share_cache = true});
  EXPECT_EQ(sorted(ids_of(v3)), expected()["delta_dv"]["3"].get<std::vector<int64_t>>());
}

TEST(DeltaDeletionVectors, PartitionedTableReadsTheRowsAndLabelsDeltaRsReads) {
  auto t = Table::open("delta:" + tables() + "/delta_dv_part");
  Reader r(t, {.columns = {{.name = "id", .dtype = torch::kLong},
                           {.name = "label", .dtype = torch::kLong}},
               .batch_size = 7,
               .num_replicas = 1,
               .rank = 0});
  std::vector<std::vector<int64_t>> got;
  while (auto b = r.next()) {
    auto id = b->at("id"), label = b->at("label");
    for (int64_t i = 0; i < id.size(0); ++i)
      got.push_back({id[i].item<int64_t>(), label[i].item<int64_t>()});
  }
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, expected()["delta_dv_part"].get<std::vector<std::vector<int64_t>>>());
}

// The protocol's own examples: a uuid-named DV file under a random prefix.
TEST(DeltaDeletionVectors, UuidPathsFollowTheProtocolsExample) {
  namespace dd = dtrain::data::detail;
  const dd::DeletionVectorRef dv{.storage_type = "u",
                                 .path_or_inline = "ab^-aqEH.-t@S}K{vb[*k^",
                                 .offset = 4,
                                 .size_in_bytes = 40,
                                 .cardinality = 6};
  EXPECT_EQ(dd::deletion_vector_file("/mytable", dv),
            "/mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin");
  EXPECT_EQ(dv.unique_id(), "uab^-aqEH.-t@S}K{vb[*k^@4");
  EXPECT_FALSE(dd::z85_decode("abcd"));   // not a multiple of 5
  EXPECT_FALSE(dd::z85_decode("abcd~"));  // outside the alphabet
  EXPECT_FALSE(dd::z85_decode("#####"));  // above 2^32 - 1
  EXPECT_EQ(dd::z85_decode("00000"), std::string(4, '\0'));
}

TEST(DeltaDeletionVectors, MissingCorruptOrForeignVectorsNameTableFileAndRemedy) {
  const std::string bad = tables() + "/delta_dv_bad";
  std::string dv_name;
  for (const auto& e : std::filesystem::directory_iterator(bad + "/crc"))
    if (e.path().filename().string().rfind("deletion_vector_", 0) == 0)
      dv_name = e.path().filename().string();
  ASSERT_FALSE(dv_name.empty());
  const std::map<std::string, std::string> want = {
      {"missing", "does not exist or cannot be read: the table was vacuumed past this version"},
      {"truncated", "which ends inside it"},
      {"crc", "with the CRC-32"},
      {"magic", "its magic number is"},
      {"cardinality", "deletes 2 rows, but the log says 3"}};
  for (const auto& [name, text] : want) {
    const std::string dir = bad + "/" + name;
    auto msg = error_of([&] { Table::open("delta:" + dir); });
    EXPECT_NE(msg.find(text), std::string::npos) << name << ": " << msg;
    EXPECT_NE(msg.find("Delta table " + dir + " at version 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir + "/" + dv_name), std::string::npos) << msg;
    EXPECT_NE(msg.find("restore"), std::string::npos) << msg;
    // Version 0, before the delete, has no vector and reads.
    EXPECT_EQ(Table::open("delta:" + dir, {.version = 0}).num_rows(), 20);
  }
}

TEST(DeltaTable, AVariantColumnIsToleratedAndRefusedWhenAskedFor) {
  auto t = Table::open("delta:" + tables() + "/delta_variant");
  Reader r(t, {.columns = id_column(), .num_replicas = 1, .rank = 0, .shuffle = false});
  std::vector<int64_t> all(10);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(ids_of(r), all);
  auto msg = error_of([&] {
    Reader(t, {.columns = {{.name = "v", .dtype = torch::kFloat}}, .num_replicas = 1, .rank = 0});
  });
  EXPECT_NE(msg.find("column 'v' of the Delta table " + t.root() + " is (or holds) a variant"),
            std::string::npos)
      << msg;
}

// v2Checkpoint: delta-rs writes classic-named checkpoints in the V2 spec once the feature is
// on; they are read (the DV in it too). One whose file actions are in sidecar files is refused.
TEST(DeltaTable, V2SpecCheckpointsAreReadAndSidecarsRefused) {
  const std::string dir = tables() + "/delta_v2ck";
  for (const auto& [v, ids] : expected()["delta_v2ck"].items()) {
    auto t = Table::open("delta:" + dir, {.version = std::stoll(v)});
    EXPECT_EQ(sorted(ids_of_version(t)), ids.get<std::vector<int64_t>>()) << "version " << v;
  }
  const std::string side = tables() + "/delta_v2ck_sidecar";
  auto msg = error_of([&] { Table::open("delta:" + side); });
  EXPECT_NE(msg.find("the Delta checkpoint " + side +
                     "/_delta_log/00000000000000000003.checkpoint.parquet keeps its file "
                     "actions in 1 sidecar files"),
            std::string::npos)
      << msg;
  EXPECT_EQ(Table::open("delta:" + side, {.version = 2}).num_rows(), 60);  // before it
}

TEST(DataErrors, TruncatedAndCorruptFilesNameTheFile) {
  const std::string bad = tables() + "/bad";
  auto msg = error_of([&] { Table::open("parquet:" + bad + "/truncated.parquet"); });
  EXPECT_NE(msg.find(bad + "/truncated.parquet is not a readable Parquet file"), std::string::npos)
      << msg;
  // The footer of corrupt.parquet is intact: reading its data fails, naming file and column,
  // and the epoch stays failed (no silently short epoch).
  auto t = Table::open("parquet:" + bad + "/corrupt.parquet");
  Reader r(
      t,
      {.columns = id_column(), .batch_size = 10, .num_replicas = 1, .rank = 0, .shuffle = false});
  msg = error_of([&] {
    while (r.next()) {
    }
  });
  EXPECT_NE(msg.find("column 'id' of " + bad + "/corrupt.parquet (row group 0)"), std::string::npos)
      << msg;
  EXPECT_NE(error_of([&] { r.next(); }), "");
}

TEST(DataErrors, MissingColumnsAndTypesThatDoNotConvertFailAtConstruction) {
  const std::string dir = tables() + "/parquet";
  auto t = Table::open("parquet:" + dir);
  auto make = [&](Column c) {
    return error_of([&] { Reader r(t, {.columns = {c}, .num_replicas = 1, .rank = 0}); });
  };
  auto msg = make({.name = "pixels"});
  EXPECT_NE(msg.find("column 'pixels' is missing from " + dir + "/part-00000.parquet"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("its columns: id, x, label, name, xv"), std::string::npos) << msg;
  msg = make({.name = "name"});
  EXPECT_NE(msg.find("column 'name' of " + dir + "/part-00000.parquet has the type string"),
            std::string::npos)
      << msg;
  msg = make({.name = "x", .shape = {5}});
  EXPECT_NE(msg.find("holds 4 values per row, but the shape [5] needs 5"), std::string::npos)
      << msg;
  msg = make({.name = "label", .shape = {3}});
  EXPECT_NE(msg.find("holds one int32 per row"), std::string::npos) << msg;
}

TEST(DataErrors, NullsAndRaggedListsNameFileColumnAndRow) {
  const std::string bad = tables() + "/bad";
  auto read_all = [&](const std::string& file, Column c) {
    return error_of([&] {
      Reader r(Table::open("parquet:" + bad + "/" + file),
               {.columns = {c}, .batch_size = 4, .num_replicas = 1, .rank = 0});
      while (r.next()) {
      }
    });
  };
  auto msg = read_all("nulls.parquet", {.name = "label"});
  EXPECT_NE(msg.find("column 'label' of " + bad + "/nulls.parquet (row group 0) has 1 null"),
            std::string::npos)
      << msg;
  msg = read_all("ragged.parquet", {.name = "x", .shape = {4}});
  EXPECT_NE(msg.find("column 'x' of " + bad + "/ragged.parquet (row group 0) row 5 has 3 values"),
            std::string::npos)
      << msg;
}

}  // namespace
