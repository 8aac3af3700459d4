#include "train_data.h"

#include "dtrain/error.h"
#include "dtrain/sampler.h"
#if DTRAIN_HAVE_DATA
#include "dtrain/data_reader.h"
#endif

namespace fashion_mnist {

#if DTRAIN_HAVE_DATA
namespace {

// On the CPU, pixels are read as float32 and normalised by the reader as each row group is
// decoded (a preprocess: the cache keeps them normalised, as the IDX set is in memory); for a
// GPU they are read as bytes, a quarter of the bus traffic, and normalised there.
std::vector<dtrain::data::Column> columns(bool normalize) {
  std::vector<dtrain::data::Column> c{
      {.name = "image", .dtype = torch::kUInt8, .shape = {1, 28, 28}},
      {.name = "label", .dtype = torch::kLong}};
  if (normalize) {
    c[0].dtype = torch::kFloat32;
    c[0].preprocess = normalize_pixels;  // in place on float32
  }
  return c;
}

}  // namespace

struct TrainData::Table {
  dtrain::data::Reader reader;
  int64_t next_batch = 0;  // the reader's position in the epoch
};
#else
struct TrainData::Table {};

namespace {
[[noreturn]] void no_data(const std::string& location) {
  throw dtrain::UsageError(
      "fashion_mnist: this build has no dtrain::data (configured with "
      "-DDTRAIN_DATA=OFF), so it cannot read " +
      location + "; use the IDX files (--data-dir)");
}
}  // namespace
#endif

TrainData::TrainData(const std::string& location, const std::string& data_dir, int64_t batch_size,
                     uint64_t seed, torch::Device device)
    : batch_size_(batch_size), seed_(seed), device_(device) {
  if (location.empty()) {
    idx_ = load_split(data_dir, true);
    if (!device.is_cpu()) idx_ = Split{idx_->images.to(device), idx_->labels.to(device)};
  } else {
#if DTRAIN_HAVE_DATA
    table_ = std::make_unique<Table>(Table{dtrain::data::Reader(
        dtrain::data::Table::open(location),
        {.columns = columns(device.is_cpu()), .batch_size = batch_size, .seed = seed})});
#else
    no_data(location);
#endif
  }
  set_epoch(0);
}

TrainData::~TrainData() = default;

void TrainData::set_epoch(int64_t epoch) {
  epoch_ = epoch;
#if DTRAIN_HAVE_DATA
  if (table_) {
    table_->reader.set_epoch(epoch);
    table_->next_batch = 0;
    return;
  }
#endif
  dtrain::DistributedSampler sampler(idx_->labels.size(0), {.shuffle = true, .seed = seed_});
  sampler.set_epoch(epoch);
  indices_ = torch::tensor(sampler.indices(), torch::kLong).to(device_);
}

int64_t TrainData::steps_per_epoch() const {
#if DTRAIN_HAVE_DATA
  if (table_) return table_->reader.steps_per_epoch();
#endif
  return (indices_->size(0) + batch_size_ - 1) / batch_size_;
}

std::pair<torch::Tensor, torch::Tensor> TrainData::batch(int64_t b) {
#if DTRAIN_HAVE_DATA
  if (table_) {
    for (;;) {
      auto batch = table_->reader.next();
      if (!batch) throw dtrain::UsageError("fashion_mnist: batch past the epoch's end");
      if (table_->next_batch++ != b) continue;
      if (device_.is_cpu()) return {batch->at("image"), batch->at("label")};
      return {normalize_pixels(batch->at("image").to(device_)), batch->at("label").to(device_)};
    }
  }
#endif
  auto idx = indices_->narrow(0, b * batch_size_,
                              std::min<int64_t>(batch_size_, indices_->size(0) - b * batch_size_));
  return {idx_->images.index_select(0, idx), idx_->labels.index_select(0, idx)};
}

Split load_table_split(const std::string& location) {
#if DTRAIN_HAVE_DATA
  dtrain::data::Reader reader(dtrain::data::Table::open(location), {.columns = columns(true),
                                                                    .batch_size = 4096,
                                                                    .num_replicas = 1,
                                                                    .rank = 0,
                                                                    .shuffle = false});
  std::vector<torch::Tensor> images, labels;
  while (auto b = reader.next()) {
    images.push_back(b->at("image"));
    labels.push_back(b->at("label"));
  }
  return {torch::cat(images), torch::cat(labels)};
#else
  no_data(location);
#endif
}

}  // namespace fashion_mnist
