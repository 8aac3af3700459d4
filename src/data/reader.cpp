#include <nlohmann/json.hpp>

#include "data/cache.h"
#include "data/parquet_file.h"
#include "data/plan.h"
#include "data/prefetch.h"
#include "dtrain/data_reader.h"
#include "dtrain/env.h"
#include "dtrain/sampler.h"

namespace dtrain::data {

using detail::Piece;

namespace {

// num_replicas / rank left out: DistributedSampler's rule (the default group's, else the
// launcher's environment, else 1 and 0), and its checks.
std::pair<int, int> placement(const ReaderOptions& o) {
  DistributedSampler probe(0, {.num_replicas = o.num_replicas, .rank = o.rank});
  return {probe.num_replicas(), probe.rank()};
}

constexpr const char* kPositionFormat = "dtrain.data.position/1";

// Whether the launcher runs several ranks on this host (ReaderOptions::share_cache's default).
bool several_local_ranks() {
  const auto env = WorkerEnv::from_environ();
  return env && env->local_world_size > 1;
}

// What a position records of the rows it counts (TableState::digest): the data read, so that a
// position is never restored on other rows that happen to have the same counts.
nlohmann::json table_identity(const Table& table) {
  const auto& state = table.state();
  nlohmann::json id{{"format", state.format == TableFormat::kDelta ? "delta" : "parquet"},
                    {"files", state.files.size()},
                    {"digest", state.digest}};
  if (state.version) id["version"] = *state.version;
  if (!state.table_id.empty()) id["id"] = state.table_id;
  return id;
}

// Throws DataError (caught by restore(), which adds the position) when `recorded` - a
// position's "table" - is not the data `table` reads: what differs and what to do.
void check_same_data(const nlohmann::json& recorded, const Table& table) {
  const nlohmann::json now = table_identity(table);
  const std::string format = recorded.at("format").get<std::string>();
  auto at_version = [](const nlohmann::json& t) {
    return t.contains("version") ? " at version " + std::to_string(t["version"].get<int64_t>())
                                 : std::string();
  };
  if (format != now["format"]) {
    throw DataError(
        "it was taken on a " + std::string(format == "delta" ? "Delta table" : "Parquet") +
        (format == "delta" ? "" : " table") + at_version(recorded) + ", and " + table.root() +
        " is read as " + (now["format"] == "delta" ? "a Delta table" : "Parquet files") +
        ": restore it on the table it was taken on");
  }
  if (recorded.contains("id") && now.contains("id") && recorded["id"] != now["id"]) {
    throw DataError("it was taken on another Delta table (metaData id " +
                    recorded["id"].get<std::string>() + "; " + table.root() + " has " +
                    now["id"].get<std::string>() + "): restore it on the table it was taken on");
  }
  if (recorded.at("digest").get<std::string>() == now["digest"]) return;  // the same rows
  if (format == "delta") {
    if (!recorded.contains("version")) throw DataError("its Delta table has no version");
    const int64_t then = recorded["version"].get<int64_t>();
    if (table.version() && *table.version() == then) {
      // The same version number with other files: the log was rewritten, or the table replaced
      // by one with the same metaData id. Time travel cannot bring the old files back.
      throw DataError("it was taken at version " + std::to_string(then) + " of the Delta table " +
                      table.root() + ", and version " + std::to_string(then) +
                      " there now lists other files or deletion vectors (its log was rewritten "
                      "since): restore it on the table it was taken on, or start the epoch "
                      "anew (set_epoch)");
    }
    throw DataError("it was taken at version " + std::to_string(then) + " of the Delta table " +
                    table.root() + ", whose files or deletion vectors differ from version " +
                    std::to_string(*table.version()) +
                    " read here: open the table at the position's version to finish the epoch "
                    "(Table::open(location, {.version = " +
                    std::to_string(then) +
                    "}), time travel), then go on at the newer version from the "
                    "next epoch");
  }
  throw DataError("it was taken on " + std::to_string(recorded.at("files").get<int64_t>()) +
                  " Parquet files (digest " + recorded["digest"].get<std::string>() +
                  ") that differ from the " + std::to_string(now["files"].get<int64_t>()) +
                  " files under " + table.root() + " now (digest " +
                  now["digest"].get<std::string>() +
                  "): a file was added, removed or rewritten since; restore it on the files it "
                  "was taken on, or start the epoch anew (set_epoch)");
}

}  // namespace

const torch::Tensor& Batch::at(const std::string& key) const {
  auto it = tensors.find(key);
  if (it == tensors.end()) {
    std::string keys;
    for (const auto& [k, t] : tensors) keys += (keys.empty() ? "" : ", ") + k;
    throw DataError("data: the batch has no tensor '" + key + "' (it has: " + keys + ")");
  }
  return it->second;
}

struct Reader::Impl {
  explicit Impl(Table t) : table(std::move(t)) {}
  Table table;
  ReaderOptions options;
  detail::SplitOptions split;
  std::vector<int64_t> group_rows;
  int64_t epoch = 0;
  detail::RankPlan plan;
  std::vector<Piece> remaining;  // elastic: the epoch's unread rows when the plan was made
  int64_t step = 0;
  std::unique_ptr<detail::RowGroupCache> cache;  // kept across epochs and restore()
  std::unique_ptr<detail::Prefetcher> prefetch;
  // The piece being cut into batches.
  std::vector<torch::Tensor> current;
  int64_t current_rows = 0, current_used = 0;
  std::string failed;  // set once a read failed: the epoch cannot go on

  void start_plan() {
    prefetch.reset();
    current.clear();
    current_rows = current_used = 0;
    step = 0;
    failed.clear();
    plan = options.elastic ? detail::elastic_plan(remaining, split)
                           : detail::distributed_plan(group_rows, epoch, split);
    if (!options.elastic && plan.steps == 0 && table.num_rows() > 0) {
      throw DataError("data: with drop_last, " + std::to_string(group_rows.size()) +
                      " row groups over " + std::to_string(split.num_replicas) +
                      " ranks leave no rows to read: use fewer ranks, drop_last = false, or "
                      "write the table with more row groups");
    }
  }

  // The next `n` rows of this rank's stream, one tensor per column.
  std::vector<torch::Tensor> take(int64_t n) {
    std::vector<std::vector<torch::Tensor>> parts(options.columns.size());
    while (n > 0) {
      if (current_used == current_rows) {
        if (!prefetch) {
          prefetch = std::make_unique<detail::Prefetcher>(
              table.state(), options.columns, plan.pieces, options.seed, epoch, options.shuffle,
              options.threads, options.prefetch, options.read_timeout, cache.get(),
              options.thread_nice);
        }
        current = prefetch->pop();
        current_rows = current.empty() ? 0 : current[0].size(0);
        current_used = 0;
        continue;
      }
      const int64_t k = std::min(n, current_rows - current_used);
      for (size_t c = 0; c < current.size(); ++c)
        parts[c].push_back(current[c].narrow(0, current_used, k));
      current_used += k;
      n -= k;
    }
    std::vector<torch::Tensor> out;
    if (!parts.empty() && parts[0].empty()) {
      // An elastic rank's empty batch: what the columns (and their transforms) make of no rows.
      for (const auto& column : options.columns) {
        std::vector<int64_t> shape{0};
        shape.insert(shape.end(), column.shape.begin(), column.shape.end());
        out.push_back(torch::empty(shape, torch::TensorOptions().dtype(column.dtype)));
      }
      return detail::transformed(options.columns, std::move(out), 0, "an empty batch");
    }
    for (auto& p : parts) out.push_back(p.size() == 1 ? p[0] : torch::cat(p));
    return out;
  }
};

Reader::Reader(Table table, ReaderOptions options)
    : impl_(std::make_unique<Impl>(std::move(table))) {
  auto& m = *impl_;
  if (options.columns.empty()) throw UsageError("data: ReaderOptions::columns is empty");
  if (options.batch_size < 1)
    throw UsageError("data: batch_size must be >= 1, got " + std::to_string(options.batch_size));
  if (options.threads < 1 || options.prefetch < 1)
    throw UsageError("data: threads and prefetch must be >= 1");
  if (options.cache_bytes < 0)
    throw UsageError("data: cache_bytes must be >= 0 (0: no cache), got " +
                     std::to_string(options.cache_bytes));
  if (options.thread_nice < 0 || options.thread_nice > 19)
    throw UsageError("data: thread_nice must be in 0..19, got " +
                     std::to_string(options.thread_nice));
  if (options.elastic && options.drop_last)
    throw UsageError("data: drop_last does not apply in elastic mode (every row is read once)");
  for (auto& c : options.columns)
    if (c.key.empty()) c.key = c.name;
  for (size_t i = 0; i < options.columns.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (options.columns[i].key == options.columns[j].key)
        throw UsageError("data: two columns have the batch key '" + options.columns[i].key + "'");
  auto [world, rank] = placement(options);
  if (world < 1 || rank < 0 || rank >= world) {
    throw UsageError("data: invalid rank " + std::to_string(rank) + " of " + std::to_string(world) +
                     " replicas");
  }
  m.split = {.num_replicas = world,
             .rank = rank,
             .shuffle = options.shuffle,
             .seed = options.seed,
             .drop_last = options.drop_last,
             .batch_size = options.batch_size};
  m.options = std::move(options);
  std::unique_ptr<detail::SharedEntries> shared;
  if (m.options.cache_bytes > 0 && m.options.share_cache.value_or(several_local_ranks()))
    shared = detail::SharedEntries::open(m.table.state(), m.options.columns, "/dev/shm");
  m.cache = std::make_unique<detail::RowGroupCache>(m.options.cache_bytes, std::move(shared));
  // Every column against every file, now: a bad file fails here, not in the middle of an epoch.
  const auto& state = m.table.state();
  for (int f = 0; f < static_cast<int>(state.files.size()); ++f)
    for (const auto& c : m.options.columns) detail::resolve_column(state, f, c);
  if (m.table.num_rows() == 0) {
    throw DataError("data: the table " + m.table.root() +
                    (m.table.version() ? " at version " + std::to_string(*m.table.version()) : "") +
                    " has no rows");
  }
  for (const auto& rg : m.table.row_groups()) m.group_rows.push_back(rg.rows);
  set_epoch(0);
}

Reader::~Reader() = default;
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;

void Reader::set_epoch(int64_t epoch) {
  auto& m = *impl_;
  m.epoch = epoch;
  if (m.options.elastic) m.remaining = detail::epoch_start(m.group_rows, epoch, m.split);
  m.start_plan();
}

int64_t Reader::epoch() const { return impl_->epoch; }
int64_t Reader::steps_per_epoch() const { return impl_->plan.steps; }
int64_t Reader::num_samples() const { return impl_->plan.rows; }
int64_t Reader::step() const { return impl_->step; }
const Table& Reader::table() const { return impl_->table; }
const ReaderOptions& Reader::options() const { return impl_->options; }

std::optional<Batch> Reader::next() {
  auto& m = *impl_;
  if (!m.failed.empty()) throw DataError(m.failed);
  if (m.step >= m.plan.steps) return std::nullopt;
  const int64_t rows =
      std::clamp<int64_t>(m.plan.rows - m.step * m.options.batch_size, 0, m.options.batch_size);
  std::vector<torch::Tensor> tensors;
  try {
    tensors = m.take(rows);
  } catch (const std::exception& e) {
    // The epoch stops here on every later call too: never a silently short epoch.
    m.failed = e.what();
    m.prefetch.reset();
    throw;
  }
  Batch b;
  b.rows = rows;
  for (size_t c = 0; c < tensors.size(); ++c)
    b.tensors.emplace(m.options.columns[c].key, std::move(tensors[c]));
  ++m.step;
  return b;
}

std::string Reader::position() const {
  const auto& m = *impl_;
  if (!m.options.elastic) throw UsageError("data: position() needs ReaderOptions::elastic = true");
  nlohmann::json pieces = nlohmann::json::array();
  for (const auto& p : detail::elastic_after(m.remaining, m.step, m.split))
    pieces.push_back({p.group, p.begin, p.end});
  return nlohmann::json{{"format", kPositionFormat},         {"epoch", m.epoch},
                        {"row_groups", m.group_rows.size()}, {"rows", m.table.num_rows()},
                        {"table", table_identity(m.table)},  {"remaining", pieces}}
      .dump();
}

void Reader::restore(const std::string& position) {
  auto& m = *impl_;
  if (!m.options.elastic) throw UsageError("data: restore() needs ReaderOptions::elastic = true");
  std::vector<Piece> remaining;
  int64_t epoch = 0;
  try {
    auto j = nlohmann::json::parse(position);
    if (j.at("format") != kPositionFormat)
      throw DataError("it is not a " + std::string(kPositionFormat));
    // Positions written before dtrain recorded the table have no "table": not checked.
    if (j.contains("table")) check_same_data(j.at("table"), m.table);
    if (j.at("row_groups").get<size_t>() != m.group_rows.size() ||
        j.at("rows").get<int64_t>() != m.table.num_rows()) {
      throw DataError("it was taken on a table of " + std::to_string(j.at("rows").get<int64_t>()) +
                      " rows in " + std::to_string(j.at("row_groups").get<size_t>()) +
                      " row groups; this one has " + std::to_string(m.table.num_rows()) + " in " +
                      std::to_string(m.group_rows.size()));
    }
    epoch = j.at("epoch").get<int64_t>();
    for (const auto& p : j.at("remaining")) {
      Piece piece{p.at(0).get<int64_t>(), p.at(1).get<int64_t>(), p.at(2).get<int64_t>()};
      if (piece.group < 0 || piece.group >= static_cast<int64_t>(m.group_rows.size()) ||
          piece.begin < 0 || piece.end <= piece.begin ||
          piece.end > m.group_rows[static_cast<size_t>(piece.group)])
        throw DataError("a piece lies outside the table");
      remaining.push_back(piece);
    }
  } catch (const DataError& e) {
    throw DataError("data: cannot restore the position " + position.substr(0, 80) +
                    "...: " + e.what());
  } catch (const std::exception& e) {
    throw DataError("data: cannot restore the position '" + position.substr(0, 80) +
                    "': it is malformed (" + e.what() + ")");
  }
  m.epoch = epoch;
  m.remaining = std::move(remaining);
  m.start_plan();
}

}  // namespace dtrain::data
