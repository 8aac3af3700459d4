#include "data/shared_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "core/shared_files.h"
#include "data/fnv.h"
#include "dtrain/env.h"

namespace dtrain::data::detail {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'D', 'T', 'R', 'D', 'A', 'T', 'A', '1'};
constexpr int64_t kAlign = 64;

// The file: magic, rows, columns, then per column (dtype, offset, bytes); the columns' data
// at their offsets (64-byte aligned).
struct Header {
  char magic[8];
  int64_t rows;
  int64_t columns;
};
struct ColumnHeader {
  int64_t dtype;
  int64_t offset;
  int64_t bytes;
};

int64_t aligned(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

int64_t values_per_row(const Column& c) {
  return std::accumulate(c.shape.begin(), c.shape.end(), int64_t{1}, std::multiplies<>());
}

// An entry's file for `rows` rows of `columns`, all derived from them: its header (Header,
// then a ColumnHeader per column) as written, and its size. An entry checks out when its
// file starts with exactly these bytes and is at least this long.
struct Layout {
  std::string header;
  std::vector<ColumnHeader> columns;
  int64_t size = 0;
};

Layout layout_of(const std::vector<Column>& columns, int64_t rows) {
  Layout l;
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.rows = rows;
  h.columns = static_cast<int64_t>(columns.size());
  int64_t at =
      aligned(static_cast<int64_t>(sizeof(Header) + columns.size() * sizeof(ColumnHeader)));
  for (const auto& c : columns) {
    const int64_t bytes =
        rows * values_per_row(c) * static_cast<int64_t>(c10::elementSize(c.dtype));
    l.columns.push_back({static_cast<int64_t>(c.dtype), at, bytes});
    at = aligned(at + bytes);
  }
  l.header.assign(reinterpret_cast<const char*>(&h), sizeof h);
  l.header.append(reinterpret_cast<const char*>(l.columns.data()),
                  l.columns.size() * sizeof(ColumnHeader));
  l.size = at;
  return l;
}

// What decides the decoded bytes: the table's files as they are now, and the columns.
std::string identity(const TableState& table, const std::vector<Column>& columns) {
  std::ostringstream id;
  id << table.root << '\n';
  if (table.version) id << *table.version;
  for (size_t i = 0; i < table.paths.size(); ++i) {
    const std::string& path = table.paths[i];
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return "";
    id << '\n'
       << path << ' ' << st.st_size << ' ' << st.st_mtim.tv_sec << '.' << st.st_mtim.tv_nsec;
    // The rows an entry holds are the file's less its deletion vector's.
    if (i < table.files.size() && !table.files[i].deletion_vector_id.empty())
      id << " dv " << table.files[i].deletion_vector_id;
  }
  bool preprocessed = false;
  for (const auto& c : columns) {
    id << '\n' << c.name << ' ' << static_cast<int>(c.dtype);
    for (auto d : c.shape) id << ' ' << d;
    preprocessed = preprocessed || static_cast<bool>(c.preprocess);
  }
  if (preprocessed) {
    // A function cannot be compared: entries made by a preprocess are this job's alone (its
    // rendezvous address and run id; outside a launcher, this process's).
    if (const auto env = WorkerEnv::from_environ())
      id << "\njob " << env->master_addr << ':' << env->master_port << ' ' << env->run_id;
    else
      id << "\npid " << ::getpid();
  }
  return id.str();
}

// A mapping of a whole file, unmapped when the last tensor over it goes.
struct Mapping {
  void* base = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, size);
  }
};

// The columns' [rows, shape...] tensors over an entry's mapped file laid out as `l`.
std::vector<torch::Tensor> tensors_over(const std::shared_ptr<Mapping>& map, const Layout& l,
                                        const std::vector<Column>& columns, int64_t rows) {
  std::vector<torch::Tensor> out;
  for (size_t c = 0; c < columns.size(); ++c) {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), columns[c].shape.begin(), columns[c].shape.end());
    out.push_back(torch::from_blob(
        static_cast<char*>(map->base) + l.columns[c].offset, shape, [map](void*) {},
        torch::TensorOptions().dtype(columns[c].dtype)));
  }
  return out;
}

bool write_all(int fd, const void* data, size_t n, off_t at) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    at += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

std::unique_ptr<SharedEntries> SharedEntries::open(const TableState& table,
                                                   const std::vector<Column>& columns,
                                                   const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return nullptr;
  const std::string id = identity(table, columns);
  if (id.empty()) return nullptr;
  char key[40];
  std::snprintf(key, sizeof key, "%016llx%016llx", static_cast<unsigned long long>(fnv1a(id)),
                static_cast<unsigned long long>(std::hash<std::string>{}(id)));
  const std::string prefix = (fs::path(dir) / (dtrain::detail::data_cache_stem() + key)).string();
  const int fd = ::open((prefix + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {  // the last user of an earlier run is removing
    ::close(fd);
    return nullptr;
  }
  std::vector<Column> kept;
  for (const auto& c : columns)
    kept.push_back({.name = c.name, .dtype = c.dtype, .shape = c.shape});
  std::vector<int64_t> rows;
  for (const auto& rg : table.row_groups) rows.push_back(rg.rows);
  return std::unique_ptr<SharedEntries>(
      new SharedEntries(prefix, fd, std::move(kept), std::move(rows)));
}

SharedEntries::SharedEntries(std::string prefix, int lock_fd, std::vector<Column> columns,
                             std::vector<int64_t> rows)
    : prefix_(std::move(prefix)),
      lock_fd_(lock_fd),
      columns_(std::move(columns)),
      rows_(std::move(rows)) {}

SharedEntries::~SharedEntries() {
  // Let go, then try to be the last: whoever gets the lock alone removes everything.
  ::flock(lock_fd_, LOCK_UN);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0) dtrain::detail::remove_shared_files(prefix_);
  ::close(lock_fd_);
}

std::string SharedEntries::entry_path(int64_t group) const {
  return prefix_ + "-" + std::to_string(group);
}

SharedEntries::Entry SharedEntries::find(int64_t group) const {
  if (group < 0 || group >= static_cast<int64_t>(rows_.size())) return nullptr;
  const int64_t rows = rows_[static_cast<size_t>(group)];
  const Layout l = layout_of(columns_, rows);
  const int fd = ::open(entry_path(group).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  auto map = std::make_shared<Mapping>();
  if (::fstat(fd, &st) == 0 && st.st_size >= static_cast<off_t>(l.size)) {
    map->size = static_cast<size_t>(st.st_size);
    // Populated: one call maps every page, instead of a fault per page on first touch.
    map->base = ::mmap(nullptr, map->size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  }
  ::close(fd);
  if (map->base == MAP_FAILED || std::memcmp(map->base, l.header.data(), l.header.size()) != 0) {
    return nullptr;
  }
  // Read-only memory: the cache's readers copy out of it (gather_rows), never write.
  return std::make_shared<const std::vector<torch::Tensor>>(tensors_over(map, l, columns_, rows));
}

SharedEntries::Draft::~Draft() {
  if (!committed_) ::unlink(temp_.c_str());
}

SharedEntries::Entry SharedEntries::Draft::commit() {
  committed_ = ::rename(temp_.c_str(), final_.c_str()) == 0;
  return std::make_shared<const std::vector<torch::Tensor>>(tensors);
}

std::unique_ptr<SharedEntries::Draft> SharedEntries::draft(int64_t group) const {
  if (group < 0 || group >= static_cast<int64_t>(rows_.size())) return nullptr;
  const int64_t rows = rows_[static_cast<size_t>(group)];
  const Layout l = layout_of(columns_, rows);
  auto d = std::make_unique<Draft>();
  d->final_ = entry_path(group);
  d->temp_ = d->final_ + ".tmp." + std::to_string(::getpid()) + "." +
             std::to_string(static_cast<long>(::syscall(SYS_gettid)));
  const int fd = ::open(d->temp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return nullptr;
  auto map = std::make_shared<Mapping>();
  // posix_fallocate: every page now (ENOSPC here when /dev/shm is full, not SIGBUS later).
  if (::posix_fallocate(fd, 0, static_cast<off_t>(l.size)) == 0 &&
      write_all(fd, l.header.data(), l.header.size(), 0)) {
    map->size = static_cast<size_t>(l.size);
    map->base = ::mmap(nullptr, map->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
#ifdef MADV_POPULATE_WRITE
    // Writable page tables in one call (Linux 5.14+), not a fault per page while decoding.
    if (map->base != MAP_FAILED) ::madvise(map->base, map->size, MADV_POPULATE_WRITE);
#endif
  }
  ::close(fd);
  if (map->base == MAP_FAILED) return nullptr;
  d->tensors = tensors_over(map, l, columns_, rows);
  return d;
}

}  // namespace dtrain::data::detail
