// The Fashion-MNIST example trained from tables (--data parquet:DIR, --data delta:DIR, written
// by examples/fashion_mnist/write_tables.py with pyarrow and delta-rs) reaches the accuracy it
// reaches from the IDX files, measured in the same test: 1 epoch, 2 processes.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "data/written_tables.h"
#include "support/json_lines.h"

namespace {

using namespace std::chrono_literals;

nlohmann::json train(const std::vector<std::string>& extra) {
  std::vector<std::string> argv{DTRAIN_BIN, "run", "--nproc-per-node", "2", FASHION_MNIST_BIN,
                                "--epochs", "1",   "--log-every",      "0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto r = dtrain::test::run_command(argv, {.timeout = 600s});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return dtrain::test::last_json_line(r.out);
}

TEST(FashionMnistTables, ParquetAndDeltaTrainAsAccuratelyAsTheIdxFiles) {
  const std::string t = dtrain::test::written_tables("examples/fashion_mnist/write_tables.py",
                                                     "fashion_mnist_tables");
  const double idx = train({})["test_accuracy"].get<double>();
  auto parquet = train({"--data", "parquet:" + t + "/parquet/train", "--test-data",
                        "parquet:" + t + "/parquet/test"});
  auto delta =
      train({"--data", "delta:" + t + "/delta/train", "--test-data", "delta:" + t + "/delta/test"});
  EXPECT_EQ(parquet["world_size"], 2);
  // 60000 rows in 60 row groups: 469 steps of 64 per rank, as the IDX split.
  EXPECT_EQ(parquet["steps"], 469);
  EXPECT_EQ(delta["steps"], 469);
  const double p = parquet["test_accuracy"].get<double>(), d = delta["test_accuracy"].get<double>();
  std::printf("test accuracy after 1 epoch: IDX %.4f, Parquet %.4f, Delta %.4f\n", idx, p, d);
  EXPECT_GE(idx, 0.80);
  // The same data in another order (row groups shuffled, then rows in them): the same accuracy
  // within run-to-run noise.
  EXPECT_LE(std::abs(p - idx), 0.015) << "IDX " << idx << " Parquet " << p;
  EXPECT_LE(std::abs(d - idx), 0.015) << "IDX " << idx << " Delta " << d;
}

TEST(FashionMnistTables, AMissingTableIsOneClearError) {
  auto r = dtrain::test::run_command({DTRAIN_BIN, "run", "--nproc-per-node", "1", FASHION_MNIST_BIN,
                                      "--data", "delta:/nonexistent/t"},
                                     {.timeout = 120s});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("/nonexistent/t is not a Delta table: it has no _delta_log"),
            std::string::npos)
      << r.out << r.err;
}

}  // namespace
