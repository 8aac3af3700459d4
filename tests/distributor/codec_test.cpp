// The Distributor's codec: every supported kind round-trips, bad bytes are errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtrain/checkpoint.h"
#include "dtrain/codec.h"

namespace {

template <class T>
T round_trip(const T& v) {
  return dtrain::decode<T>(dtrain::encode(v));
}

enum class Mode : std::uint8_t { kTrain = 3, kEval = 7 };

struct Point {
  int x = 0;
  std::string label;
  bool operator==(const Point&) const = default;
  void serialize(dtrain::Encoder& out) const {
    out.put(x);
    out.put(label);
  }
  static Point deserialize(dtrain::Decoder& in) {
    Point p;
    p.x = in.get<int>();
    p.label = in.get<std::string>();
    return p;
  }
};

TEST(Codec, ScalarsStringsAndContainersRoundTrip) {
  EXPECT_EQ(round_trip(true), true);
  EXPECT_EQ(round_trip('x'), 'x');
  EXPECT_EQ(round_trip(int64_t{-1} << 40), int64_t{-1} << 40);
  EXPECT_EQ(round_trip(3.25f), 3.25f);
  EXPECT_EQ(round_trip(1e-300), 1e-300);
  EXPECT_EQ(round_trip(Mode::kEval), Mode::kEval);
  EXPECT_EQ(round_trip(std::string("")), "");
  EXPECT_EQ(round_trip(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(round_trip(std::vector<double>{1, 2.5, -3}), (std::vector<double>{1, 2.5, -3}));
  EXPECT_EQ(round_trip(std::vector<bool>{true, false, true}),
            (std::vector<bool>{true, false, true}));
  EXPECT_EQ(round_trip(std::vector<std::string>{"a", "", "ccc"}),
            (std::vector<std::string>{"a", "", "ccc"}));
  std::map<std::string, std::vector<int>> m{{"x", {1}}, {"y", {}}};
  EXPECT_EQ(round_trip(m), m);
  std::unordered_map<int, std::string> um{{1, "one"}, {2, "two"}};
  EXPECT_EQ(round_trip(um), um);
  EXPECT_EQ(round_trip(std::set<int>{3, 1, 2}), (std::set<int>{1, 2, 3}));
  auto tup = std::make_tuple(1, std::string("two"), 3.0, std::pair<int, bool>{4, true});
  EXPECT_EQ(round_trip(tup), tup);
  EXPECT_EQ(round_trip(std::optional<int>{}), std::nullopt);
  EXPECT_EQ(round_trip(std::optional<int>{5}), 5);
  EXPECT_EQ(round_trip(std::array<int, 3>{7, 8, 9}), (std::array<int, 3>{7, 8, 9}));
  EXPECT_EQ(round_trip(Point{3, "p"}), (Point{3, "p"}));
  EXPECT_EQ(round_trip(std::vector<Point>{{1, "a"}, {2, "b"}}),
            (std::vector<Point>{{1, "a"}, {2, "b"}}));
}

TEST(Codec, TensorsKeepDtypeShapeValuesAndRequiresGrad) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kInt64, torch::kInt32, torch::kInt8,
                     torch::kUInt8, torch::kBool, torch::kFloat16, torch::kBFloat16}) {
    auto t = (torch::arange(24) % 5).to(dtype).reshape({2, 3, 4});
    auto back = round_trip(t);
    EXPECT_EQ(back.scalar_type(), dtype);
    EXPECT_EQ(back.sizes(), t.sizes());
    EXPECT_TRUE(torch::equal(back, t)) << dtype;
  }
  auto scalar = torch::tensor(2.5);
  EXPECT_EQ(round_trip(scalar).dim(), 0);
  EXPECT_EQ(round_trip(scalar).item<double>(), 2.5);
  auto empty = torch::empty({0, 5});
  EXPECT_EQ(round_trip(empty).sizes(), empty.sizes());
  // A strided view travels as its values.
  auto base = torch::arange(12, torch::kFloat32).reshape({3, 4});
  auto view = base.t();
  EXPECT_TRUE(torch::equal(round_trip(view), view));
  auto param = torch::ones({2}, torch::requires_grad());
  EXPECT_TRUE(round_trip(param).requires_grad());
  EXPECT_FALSE(round_trip(torch::Tensor()).defined());
  // A conjugated view travels as the values it shows.
  auto z = torch::complex(torch::ones({2}), torch::full({2}, 2.0));
  EXPECT_TRUE(torch::equal(round_trip(z.conj()), z.conj().resolve_conj()));
}

TEST(Codec, AStateDictRoundTripsInOrder) {
  torch::nn::Sequential model(torch::nn::Linear(3, 2), torch::nn::BatchNorm1d(2));
  auto sd = dtrain::state_dict(*model);
  auto back = round_trip(sd);
  ASSERT_EQ(back.keys(), sd.keys());
  for (const auto& item : sd) EXPECT_TRUE(torch::equal(back[item.key()], item.value()));
  EXPECT_NE(std::find(sd.keys().begin(), sd.keys().end(), "1.running_var"), sd.keys().end());
}

TEST(Codec, TruncatedOrMistypedBytesThrowCodecError) {
  std::string bytes = dtrain::encode(std::vector<double>{1, 2, 3});
  EXPECT_THROW(dtrain::decode<std::vector<double>>(bytes.substr(0, bytes.size() - 1)),
               dtrain::CodecError);
  // Leftover bytes: encoded as something longer than what is asked for.
  EXPECT_THROW(dtrain::decode<int>(bytes), dtrain::CodecError);
  // A corrupt count must not allocate: 2^60 elements claimed in 8 bytes.
  dtrain::Encoder e;
  e.write_size(uint64_t{1} << 60);
  EXPECT_THROW(dtrain::decode<std::vector<std::string>>(e.take()), dtrain::CodecError);
  // A tensor header claiming 2^40 floats with 4 bytes behind it: an error, not an allocation.
  dtrain::Encoder big;
  big.put<std::uint8_t>(static_cast<std::uint8_t>(c10::ScalarType::Float));
  big.put<std::uint8_t>(1);
  big.write_size(2);
  big.put<int64_t>(int64_t{1} << 20);
  big.put<int64_t>(int64_t{1} << 20);
  big.put<float>(1.0f);
  EXPECT_THROW(dtrain::decode<torch::Tensor>(big.take()), dtrain::CodecError);
  EXPECT_THROW(dtrain::decode<bool>(std::string(1, '\x07')), dtrain::CodecError);
  try {
    dtrain::decode<std::string>(std::string(4, '\0'));
    FAIL();
  } catch (const dtrain::CodecError& err) {
    EXPECT_NE(std::string(err.what()).find("truncated"), std::string::npos) << err.what();
  }
}

TEST(Codec, LoadStateDictChecksNamesAndShapes) {
  torch::nn::Linear a(3, 2), b(3, 2), wrong(4, 2);
  dtrain::load_state_dict(*b, dtrain::state_dict(*a));
  EXPECT_TRUE(torch::equal(a->weight, b->weight));
  EXPECT_THROW(dtrain::load_state_dict(*wrong, dtrain::state_dict(*a)), dtrain::UsageError);
  auto partial = dtrain::state_dict(*a);
  partial.erase("bias");
  EXPECT_THROW(dtrain::load_state_dict(*b, partial), dtrain::UsageError);
  dtrain::load_state_dict(*b, partial, /*strict=*/false);
}

}  // namespace
