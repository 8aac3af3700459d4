// Fashion-MNIST from the gzipped IDX files Debian's dataset-fashion-mnist ships in
// /usr/share/datasets/fashion-mnist, read straight into memory as tensors.
#pragma once

#include <torch/torch.h>

#include <string>

namespace fashion_mnist {

struct Split {
  torch::Tensor images;  // [N, 1, 28, 28] float32, normalised with the training set's mean/std
  torch::Tensor labels;  // [N] int64, 0..9
};

// Pixels (0-255, any dtype) as the model takes them: float32, divided by 255 and normalised
// with the training set's mean and standard deviation.
torch::Tensor normalize_pixels(const torch::Tensor& pixels);

// Reads DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz. Throws std::runtime_error naming
// the file and what is wrong (missing, not gzip, bad IDX magic, count mismatch) and how to
// get the data (apt-get install dataset-fashion-mnist, or --data-dir).
// limit >= 0: only the first `limit` images and labels (all when the file has fewer); the
// files are decompressed only that far, so a subset costs what it holds.
Split load_split(const std::string& dir, bool train, int64_t limit = -1);

}  // namespace fashion_mnist
