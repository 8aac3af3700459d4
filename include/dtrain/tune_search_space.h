// Search spaces for dtrain::tune, with Ray Tune's semantics (ray/tune/search/sample.py and
// variant_generator.py, Ray 2.60).
//
//     using namespace dtrain::tune;
//     Config space = {
//         {"lr", loguniform(1e-4, 1e-1)},          // exp(uniform(log lo, log hi))
//         {"batch_size", choice({32, 64, 128})},
//         {"hidden", grid_search({64, 128, 256})},  // every value, crossed with other grids
//         {"optim", {{"momentum", uniform(0.8, 0.99)}, {"nesterov", true}}},  // nested
//     };
//     auto configs = generate_variants(space, /*num_samples=*/2, /*seed=*/7);  // 6 configs
//
// A space is JSON (insertion-ordered, like a Python dict): plain values are constants,
// `{"grid_search": [...]}` is a grid (Ray's own spelling), and the functions below return
// domain objects `{"__domain__": kind, ...}`. Being JSON, a space is saved with a search and
// read back on resume unchanged.
//
// Semantics kept from Ray:
//   - uniform(lo, hi): float in [lo, hi). loguniform(lo, hi): exp(uniform(log lo, log hi)).
//   - quniform(lo, hi, q): the bounds snapped inwards onto multiples of q, a uniform draw
//     between them, rounded half-to-even to a multiple of q.
//   - qloguniform(lo, hi, q): loguniform between the bounds snapped inwards onto multiples of
//     q, rounded half-to-even to a multiple of q (both bounds reachable). Float.
//   - randn(mean, sd): a normal draw. qrandn(mean, sd, q): rounded to a multiple of q. Float.
//   - randint(lo, hi): integer in [lo, hi) (upper bound exclusive, as numpy's).
//   - qrandint(lo, hi, q): a uniform choice among the multiples of q in [lo, hi] - the upper
//     bound inclusive, except with q = 1 ([lo, hi), as randint). Integer.
//   - lograndint(lo, hi): floor(exp(uniform(log lo, log hi))), in [lo, hi). Integer.
//   - qlograndint(lo, hi, q): k * q with k = floor(exp(uniform(log k_lo, log (k_hi + 1)))) over
//     the multiples k * q in [lo, hi] (upper inclusive except with q = 1). Integer.
//   - choice(values): one of the values, each equally likely.
//   - grid_search(values): the grids are crossed, the lexicographically first parameter path
//     varying fastest (Ray sorts grid paths, then counts like an odometer from the first);
//     the whole grid is repeated num_samples times, random parameters drawn anew for every
//     variant.
//   - sample_from(fn): Ray's tune.sample_from(lambda config: ...): fn's value for the variant's
//     config as resolved so far, e.g. {"b", sample_from([](const Config& c) {
//     return c.at("a").get<int>() * 2; })}. Resolved as Ray's _resolve_domain_vars: after the
//     grid values are set, the domains in the space's order (random ones drawn as they come),
//     pass after pass; a function that reads a value not resolved yet (a domain object, which
//     nlohmann refuses to read as a number or string: json::type_error) is asked again in the
//     next pass, as Ray asks again a function that met an unresolved value
//     (RecursiveDependencyError). So `b` may read a grid value, a constant, a random value
//     drawn after it in the space, or another sample_from's value. sample_from([] { ... }),
//     Ray's tune.sample_from(lambda: ...), takes no config: called once per variant where its
//     turn comes in the first pass, never asked again (any exception from it is an error).
// Draws come from a RandomSource: seeded (reproducible) or recorded draws (the Ray parity
// tests feed the same draws to Ray and to dtrain).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

namespace dtrain::tune {

// A trial's configuration and a search space: insertion-ordered JSON, as Python dicts are.
using Config = nlohmann::ordered_json;

// Where random draws come from. Every random decision in dtrain::tune (sampling a domain,
// PBT's explore and exploit, ASHA's bracket) is made from uniform draws in [0, 1), mapped
// the same documented way, so a recorded list of draws replays a search exactly.
class RandomSource {
 public:
  virtual ~RandomSource() = default;
  virtual double uniform01() = 0;  // in [0, 1)
  // floor(u * n), clamped to n - 1: an index into n items.
  std::size_t index(std::size_t n);
};

// Seeded: the same seed gives the same draws on every machine (mt19937_64 and our own
// mapping to [0, 1), not std::uniform_real_distribution, whose output is not specified).
class SeededRandom : public RandomSource {
 public:
  explicit SeededRandom(std::uint64_t seed) : engine_(seed) {}
  double uniform01() override;

 private:
  std::mt19937_64 engine_;
};

// Replays a fixed list of draws; throws dtrain::UsageError when they run out.
class RecordedRandom : public RandomSource {
 public:
  explicit RecordedRandom(std::vector<double> draws) : draws_(std::move(draws)) {}
  double uniform01() override;
  std::size_t used() const { return next_; }

 private:
  std::vector<double> draws_;
  std::size_t next_ = 0;
};

// Domains. Bounds are checked here (UsageError with the offending values) where Ray raises,
// at construction or when it samples: a log domain's bound <= 0, a float domain's bound not
// a multiple of q, an integer domain with no multiple of q between its bounds, sd <= 0; also
// q <= 0, and lower >= upper where the upper bound is exclusive or the scale is continuous.
Config uniform(double lower, double upper);
Config loguniform(double lower, double upper);
Config quniform(double lower, double upper, double q);
Config qloguniform(double lower, double upper, double q);
Config randn(double mean = 0.0, double sd = 1.0);
Config qrandn(double mean, double sd, double q);
Config randint(std::int64_t lower, std::int64_t upper);
Config qrandint(std::int64_t lower, std::int64_t upper, std::int64_t q = 1);
Config lograndint(std::int64_t lower, std::int64_t upper);
Config qlograndint(std::int64_t lower, std::int64_t upper, std::int64_t q);
Config choice(const std::vector<Config>& categories);
Config grid_search(const std::vector<Config>& values);

// Ray's tune.sample_from: `fn` gets the variant's config (the whole space, resolved so far) and
// returns the value (a plain value: not a domain or grid). `name` names it in errors (and the Ray
// parity test's peer). The domain object, {"__domain__": "sample_from", "function": name, "id":
// n}, refers to `fn` in a table of this process (a Config is JSON; a function is not), so it is
// resolved only in the process that made it: a space read back from a saved search is not
// sampled again. Thread-safe. generate_variants throws UsageError when fn throws anything but a
// type_error, when fn's value is a domain or a grid, and when a pass resolves nothing (functions
// that depend on each other, or a type_error with nothing left to wait for), naming the key.
using SampleFunction = std::function<Config(const Config& config)>;
Config sample_from(SampleFunction fn, std::string name = "");

// Ray's tune.sample_from(lambda: ...) (sample.py's Function with pass_config False): `fn` takes
// no argument and is called once per variant at its place in the first pass (it reads nothing,
// so it never waits for a later one); anything it throws, nlohmann's type_error included, is
// a UsageError naming it, as Ray's "Failed to evaluate expression". Otherwise as above.
using SampleFunctionNoConfig = std::function<Config()>;
namespace detail {
Config sample_from_no_config(SampleFunctionNoConfig fn, std::string name);
}  // namespace detail
template <class F, std::enable_if_t<std::is_invocable_v<F&>, int> = 0>
Config sample_from(F fn, std::string name = "") {
  return detail::sample_from_no_config(SampleFunctionNoConfig(std::move(fn)), std::move(name));
}

// True if `value` is one of the domain objects above, sample_from's included (not a grid).
bool is_domain(const Config& value);
bool is_grid(const Config& value);

// One draw from a domain object (UsageError if `domain` is not one, or is a sample_from,
// which needs the config: generate_variants resolves it).
Config sample(const Config& domain, RandomSource& random);

// Every configuration of a search: the grid crossed, repeated num_samples times, random
// domains drawn for each variant; in Ray's order. UsageError: num_samples < 1, malformed
// domain.
std::vector<Config> generate_variants(const Config& space, int num_samples, RandomSource& random);
std::vector<Config> generate_variants(const Config& space, int num_samples, std::uint64_t seed);

// The number of variants generate_variants returns (grid size x num_samples).
std::size_t count_variants(const Config& space, int num_samples);

}  // namespace dtrain::tune
