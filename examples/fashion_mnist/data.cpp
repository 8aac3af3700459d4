#include "data.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <vector>

namespace fashion_mnist {

namespace {

// The training set's pixel mean and standard deviation (of x / 255).
constexpr double kMean = 0.2860;
constexpr double kStd = 0.3530;

// The decompressed file, or its first max_bytes when max_bytes >= 0.
std::string read_gzip(const std::string& path, int64_t max_bytes = -1) {
  if (!std::filesystem::exists(path)) {
    throw std::runtime_error(
        "Fashion-MNIST file " + path +
        " does not exist: install the data with `apt-get install dataset-fashion-mnist` "
        "or point --data-dir at a directory holding the four *-ubyte.gz files");
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path);
  std::string out;
  char buf[1 << 16];
  int n = 0;
  auto want = [&] {
    if (max_bytes < 0) return static_cast<unsigned>(sizeof buf);
    return static_cast<unsigned>(
        std::min<int64_t>(sizeof buf, max_bytes - static_cast<int64_t>(out.size())));
  };
  while (want() > 0 && (n = gzread(f, buf, want())) > 0) out.append(buf, static_cast<size_t>(n));
  if (want() == 0) n = 0;
  int err = 0;
  const char* msg = gzerror(f, &err);
  gzclose(f);
  if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
    throw std::runtime_error(path +
                             " is not a readable gzip file: " + (msg ? msg : "unknown error"));
  }
  return out;
}

uint32_t be32(const std::string& s, size_t at) {
  auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])); };
  return (b(0) << 24) | (b(1) << 16) | (b(2) << 8) | b(3);
}

}  // namespace

torch::Tensor normalize_pixels(const torch::Tensor& pixels) {
  return pixels.to(torch::kFloat32).div_(255).sub_(kMean).div_(kStd);
}

Split load_split(const std::string& dir, bool train, int64_t limit) {
  const std::string stem = train ? "train" : "t10k";
  const std::string images_path = dir + "/" + stem + "-images-idx3-ubyte.gz";
  const std::string labels_path = dir + "/" + stem + "-labels-idx1-ubyte.gz";
  std::string images = read_gzip(images_path, limit < 0 ? -1 : 16 + limit * 28 * 28);
  std::string labels = read_gzip(labels_path, limit < 0 ? -1 : 8 + limit);
  if (images.size() < 16 || be32(images, 0) != 0x803) {
    throw std::runtime_error(images_path + " is not an IDX image file (magic 0x00000803 expected)");
  }
  if (labels.size() < 8 || be32(labels, 0) != 0x801) {
    throw std::runtime_error(labels_path + " is not an IDX label file (magic 0x00000801 expected)");
  }
  const int64_t total = be32(images, 4), rows = be32(images, 8), cols = be32(images, 12);
  const int64_t n = limit < 0 ? total : std::min(limit, total);
  if (rows != 28 || cols != 28 || images.size() != static_cast<size_t>(16 + n * rows * cols)) {
    throw std::runtime_error(images_path + ": expected " + std::to_string(n) +
                             " images of 28x28, the file size says otherwise");
  }
  if (be32(labels, 4) != total || labels.size() != static_cast<size_t>(8 + n)) {
    throw std::runtime_error(labels_path + ": expected " + std::to_string(n) + " labels to match " +
                             images_path);
  }
  Split s;
  auto pixels = torch::from_blob(images.data() + 16, {n, 1, rows, cols}, torch::kUInt8);
  s.images = normalize_pixels(pixels);
  s.labels = torch::from_blob(labels.data() + 8, {n}, torch::kUInt8).to(torch::kInt64);
  return s;
}

}  // namespace fashion_mnist
