// Search spaces: domains, sampling and variant generation with Ray Tune's semantics.
// The mapping of one uniform draw u in [0, 1) to each domain is part of the contract (the
// Ray parity test maps numpy's draws the same way):
//   uniform   lo + (hi - lo) * u                 (numpy's uniform)
//   loguniform exp(uniform(log lo, log hi))       (Ray's Float._LogUniform)
//   randint   lo + floor((hi - lo) * u)           (numpy's integers, hi exclusive)
//   choice    categories[floor(n * u)]
//   normal    mean + sd * sqrt(-2 log(1 - u1)) * cos(2 pi u2)   (two draws; Box-Muller)
// and the composed domains as Ray composes its samplers (Float/Integer, LogUniform, Normal,
// Quantized in sample.py): the quantized ones draw on the grid of multiples of q between the
// bounds snapped inwards, log-uniform integers are floor(exp(uniform(log lo, log hi))).
#include "dtrain/tune_search_space.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/thread_annotations.h"
#include "dtrain/error.h"

namespace dtrain::tune {

namespace {

constexpr const char* kDomainKey = "__domain__";

// sample_from's functions. A space is JSON, so its sample_from domain holds an index into this
// table; entries are only added (a domain made once stays valid for the process's life).
struct SampleEntry {
  std::string name;
  SampleFunction fn;
  bool pass_config = true;  // false: Ray's zero-argument function, never asked again
};
struct SampleFunctions {
  Mutex mu;
  std::vector<SampleEntry> entries DTRAIN_GUARDED_BY(mu);
};

SampleFunctions& sample_functions() {
  static SampleFunctions* table = new SampleFunctions;  // never destroyed: static destruction
  return *table;
}

bool is_sample_from(const Config& v) {
  return v.is_object() && v.contains(kDomainKey) && v.at(kDomainKey) == "sample_from";
}

// The function a sample_from domain names (UsageError when this process has none by that index:
// a space from elsewhere, a saved search).
SampleEntry sample_function(const Config& d) {
  auto& t = sample_functions();
  MutexLock lock(t.mu);
  const Config& id = d.contains("id") ? d.at("id") : Config();
  if (!id.is_number_unsigned() || id.get<std::size_t>() >= t.entries.size()) {
    throw UsageError("tune: sample_from domain " + d.dump() +
                     " names no function of this process (sample_from() makes the domain; a "
                     "space read back from a saved search or another process is not resolved "
                     "again)");
  }
  return t.entries[id.get<std::size_t>()];
}

std::string num(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  return s.str();
}

// Ray's Quantized._grid_index: a bound's index on the grid of multiples of q, rounded
// inwards unless it already is (within math.isclose's default rel_tol 1e-9) a multiple.
double grid_index(double bound, double q, bool lower) {
  if (!std::isfinite(bound)) return bound;
  const double scaled = bound / q;
  const double nearest = std::nearbyint(scaled);  // Python's round(): half to even
  const double tol = 1e-9 * std::max(std::fabs(scaled), std::fabs(nearest));
  if (std::fabs(scaled - nearest) <= tol) return nearest;
  return lower ? std::ceil(scaled) : std::floor(scaled);
}

double draw_uniform(double lo, double hi, RandomSource& r) {
  return lo + (hi - lo) * r.uniform01();
}

double draw_normal(double mean, double sd, RandomSource& r) {
  const double u1 = r.uniform01();
  const double u2 = r.uniform01();
  return mean + sd * std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * M_PI * u2);
}

// Ray's Integer._LogUniform: floor(exp(uniform(log lo, log hi))).
std::int64_t draw_log_int(std::int64_t lo, std::int64_t hi, RandomSource& r) {
  const double v = std::exp(
      draw_uniform(std::log(static_cast<double>(lo)), std::log(static_cast<double>(hi)), r));
  return static_cast<std::int64_t>(std::floor(v));
}

// Ray's Quantized.sample for an Integer domain: the grid indices of the bounds (lower up,
// upper down), the upper one inclusive unless q is 1.
struct IndexRange {
  std::int64_t lo, hi;  // [lo, hi)
};
IndexRange index_range(std::int64_t lower, std::int64_t upper, std::int64_t q) {
  const double qd = static_cast<double>(q);
  const auto lo = static_cast<std::int64_t>(grid_index(static_cast<double>(lower), qd, true));
  const auto hi = static_cast<std::int64_t>(grid_index(static_cast<double>(upper), qd, false));
  return {lo, hi + (q == 1 ? 0 : 1)};
}

bool multiple_of(double bound, double q) {
  const double scaled = bound / q;
  const double nearest = std::nearbyint(scaled);
  return std::fabs(scaled - nearest) <= 1e-9 * std::max(std::fabs(scaled), std::fabs(nearest));
}

std::string num(std::int64_t v) { return std::to_string(v); }

// Depth-first over objects (insertion order) and arrays, as Ray's
// _split_resolved_unresolved_values: the paths of every grid and every domain.
struct Var {
  Config::json_pointer pointer;
  std::vector<Config> sort_key;  // the path as JSON values, for Ray's sorted grid order
  const Config* value;
};

void collect(const Config& node, Config::json_pointer at, std::vector<Config> key,
             std::vector<Var>& grids, std::vector<Var>& domains) {
  if (is_grid(node)) {
    grids.push_back({at, key, &node});
    return;
  }
  if (is_domain(node)) {
    domains.push_back({at, key, &node});
    return;
  }
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      auto k = key;
      k.emplace_back(it.key());
      collect(it.value(), at / it.key(), k, grids, domains);
    }
  } else if (node.is_array()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      auto k = key;
      k.emplace_back(static_cast<std::int64_t>(i));
      collect(node[i], at / i, k, grids, domains);
    }
  }
}

void check_space(const Config& node, const std::string& where) {
  if (is_grid(node)) {
    if (!node.at("grid_search").is_array() || node.at("grid_search").empty()) {
      throw UsageError("tune: grid_search at '" + where +
                       "' needs a non-empty list of values, got " + node.dump());
    }
    return;
  }
  if (node.is_object() && node.contains(kDomainKey) && !is_domain(node)) {
    throw UsageError("tune: unknown domain at '" + where + "': " + node.dump() +
                     " (use uniform, quniform, loguniform, qloguniform, randn, qrandn, randint, "
                     "qrandint, lograndint, qlograndint, choice or sample_from)");
  }
  if (node.is_object() && !is_domain(node)) {
    for (auto it = node.begin(); it != node.end(); ++it)
      check_space(it.value(), where + "/" + it.key());
  }
}

// Ray's _resolve_domain_vars (constant_grid_search=False), once per variant, its grid values
// set: the domains in the space's order, pass after pass until all are resolved. A random one
// is drawn in the first pass; a sample_from whose function meets a value not resolved yet (a
// type_error while other domains are left) waits for the next pass, as Ray's
// RecursiveDependencyError. A pass that resolves nothing is Ray's unresolved dependency error.
void resolve_domains(Config& c, const std::vector<Var>& domains, RandomSource& random) {
  std::vector<bool> done(domains.size(), false);
  std::size_t left = domains.size();
  while (left > 0) {
    std::size_t resolved = 0;
    std::string waiting;  // the last function that waited, and on what
    for (std::size_t i = 0; i < domains.size(); ++i) {
      if (done[i]) continue;
      const Var& d = domains[i];
      const std::string where = d.pointer.to_string();
      if (!is_sample_from(*d.value)) {
        c[d.pointer] = sample(*d.value, random);
      } else {
        const auto [name, fn, pass_config] = sample_function(*d.value);
        Config value;
        try {
          value = fn(c);
        } catch (const Config::type_error& e) {
          if (!pass_config) {  // read no config: Ray's "Failed to evaluate expression"
            throw UsageError("tune: failed to evaluate sample_from '" + name + "' at '" + where +
                             "': " + e.what());
          }
          if (left == 1) {
            throw UsageError("tune: sample_from '" + name + "' at '" + where +
                             "' failed with every other value resolved: " + e.what());
          }
          waiting = "'" + name + "' at '" + where + "' (" + e.what() + ")";
          continue;
        } catch (const std::exception& e) {
          throw UsageError("tune: failed to evaluate sample_from '" + name + "' at '" + where +
                           "': " + e.what());
        }
        if (is_domain(value) || is_grid(value)) {
          throw UsageError("tune: sample_from '" + name + "' at '" + where + "' returned " +
                           value.dump() +
                           "; it must return a plain value (a returned domain or grid_search, "
                           "which Ray would expand further, is not supported)");
        }
        c[d.pointer] = std::move(value);
      }
      done[i] = true;
      --left;
      ++resolved;
    }
    if (resolved == 0) {
      throw UsageError("tune: " + std::to_string(left) +
                       " sample_from value(s) depend on values never resolved (each other, in a "
                       "circle?); the last to wait: " +
                       waiting);
    }
  }
}

}  // namespace

std::size_t RandomSource::index(std::size_t n) {
  if (n == 0) throw UsageError("tune: cannot choose among zero items");
  auto i = static_cast<std::size_t>(std::floor(uniform01() * static_cast<double>(n)));
  return std::min(i, n - 1);
}

double SeededRandom::uniform01() {
  // 53 random bits -> [0, 1), identical on every platform.
  return static_cast<double>(engine_() >> 11) * 0x1.0p-53;
}

double RecordedRandom::uniform01() {
  if (next_ >= draws_.size()) {
    throw UsageError("tune: RecordedRandom ran out after " + std::to_string(draws_.size()) +
                     " draws; record more draws for this sequence");
  }
  return draws_[next_++];
}

Config uniform(double lower, double upper) {
  if (!(lower < upper) || !std::isfinite(lower) || !std::isfinite(upper)) {
    throw UsageError("tune::uniform(" + num(lower) + ", " + num(upper) +
                     "): needs finite bounds with lower < upper");
  }
  return Config{{kDomainKey, "uniform"}, {"lower", lower}, {"upper", upper}};
}

Config loguniform(double lower, double upper) {
  if (!(lower > 0) || !(lower < upper) || !std::isfinite(upper)) {
    throw UsageError("tune::loguniform(" + num(lower) + ", " + num(upper) +
                     "): needs 0 < lower < upper < inf");
  }
  return Config{{kDomainKey, "loguniform"}, {"lower", lower}, {"upper", upper}};
}

Config quniform(double lower, double upper, double q) {
  if (!(lower < upper) || !(q > 0)) {
    throw UsageError("tune::quniform(" + num(lower) + ", " + num(upper) + ", " + num(q) +
                     "): needs lower < upper and q > 0");
  }
  // Ray's Float.quantized: both bounds must be multiples of q (math.isclose).
  for (double bound : {lower, upper}) {
    if (!multiple_of(bound, q)) {
      throw UsageError("tune::quniform: the bound " + num(bound) +
                       " is not a multiple of the quantization factor q=" + num(q));
    }
  }
  return Config{{kDomainKey, "quniform"}, {"lower", lower}, {"upper", upper}, {"q", q}};
}

Config qloguniform(double lower, double upper, double q) {
  const std::string call =
      "tune::qloguniform(" + num(lower) + ", " + num(upper) + ", " + num(q) + ")";
  if (!(lower > 0) || !(lower < upper) || !std::isfinite(upper) || !(q > 0)) {
    throw UsageError(call + ": needs 0 < lower < upper < inf and q > 0");
  }
  for (double bound : {lower, upper}) {
    if (!multiple_of(bound, q)) {
      throw UsageError(call + ": the bound " + num(bound) +
                       " is not a multiple of the quantization factor q=" + num(q));
    }
  }
  return Config{{kDomainKey, "qloguniform"}, {"lower", lower}, {"upper", upper}, {"q", q}};
}

Config randn(double mean, double sd) {
  if (!(sd > 0) || !std::isfinite(sd) || !std::isfinite(mean)) {
    throw UsageError("tune::randn(" + num(mean) + ", " + num(sd) +
                     "): needs a finite mean and sd > 0");
  }
  return Config{{kDomainKey, "randn"}, {"mean", mean}, {"sd", sd}};
}

Config qrandn(double mean, double sd, double q) {
  if (!(sd > 0) || !std::isfinite(sd) || !std::isfinite(mean) || !(q > 0)) {
    throw UsageError("tune::qrandn(" + num(mean) + ", " + num(sd) + ", " + num(q) +
                     "): needs a finite mean, sd > 0 and q > 0");
  }
  return Config{{kDomainKey, "qrandn"}, {"mean", mean}, {"sd", sd}, {"q", q}};
}

Config randint(std::int64_t lower, std::int64_t upper) {
  if (!(lower < upper)) {
    throw UsageError("tune::randint(" + std::to_string(lower) + ", " + std::to_string(upper) +
                     "): needs lower < upper (the upper bound is exclusive)");
  }
  return Config{{kDomainKey, "randint"}, {"lower", lower}, {"upper", upper}};
}

Config qrandint(std::int64_t lower, std::int64_t upper, std::int64_t q) {
  const std::string call = "tune::qrandint(" + num(lower) + ", " + num(upper) + ", " + num(q) + ")";
  if (q < 1) throw UsageError(call + ": needs q >= 1");
  const IndexRange r = index_range(lower, upper, q);
  if (r.hi <= r.lo) {
    throw UsageError(call + (q == 1 ? ": needs lower < upper (with q = 1 the upper bound is "
                                      "exclusive)"
                                    : ": there is no multiple of q between the bounds"));
  }
  return Config{{kDomainKey, "qrandint"}, {"lower", lower}, {"upper", upper}, {"q", q}};
}

Config lograndint(std::int64_t lower, std::int64_t upper) {
  if (!(lower > 0) || !(lower < upper)) {
    throw UsageError("tune::lograndint(" + num(lower) + ", " + num(upper) +
                     "): needs 0 < lower < upper (the upper bound is exclusive)");
  }
  return Config{{kDomainKey, "lograndint"}, {"lower", lower}, {"upper", upper}};
}

Config qlograndint(std::int64_t lower, std::int64_t upper, std::int64_t q) {
  const std::string call =
      "tune::qlograndint(" + num(lower) + ", " + num(upper) + ", " + num(q) + ")";
  if (!(lower > 0) || !(upper > 0) || q < 1) {
    throw UsageError(call + ": needs lower > 0, upper > 0 and q >= 1");
  }
  const IndexRange r = index_range(lower, upper, q);
  if (r.hi <= r.lo) {
    throw UsageError(call + (q == 1 ? ": needs lower < upper (with q = 1 the upper bound is "
                                      "exclusive)"
                                    : ": there is no multiple of q between the bounds"));
  }
  return Config{{kDomainKey, "qlograndint"}, {"lower", lower}, {"upper", upper}, {"q", q}};
}

Config choice(const std::vector<Config>& categories) {
  if (categories.empty()) throw UsageError("tune::choice: needs at least one category");
  return Config{{kDomainKey, "choice"}, {"categories", categories}};
}

namespace {

Config add_sample_function(SampleFunction fn, std::string name, bool pass_config) {
  auto& t = sample_functions();
  MutexLock lock(t.mu);
  if (name.empty()) name = "function " + std::to_string(t.entries.size());
  t.entries.push_back({name, std::move(fn), pass_config});
  return Config{{kDomainKey, "sample_from"}, {"function", name}, {"id", t.entries.size() - 1}};
}

}  // namespace

Config sample_from(SampleFunction fn, std::string name) {
  if (!fn) throw UsageError("tune::sample_from: the function is empty");
  return add_sample_function(std::move(fn), std::move(name), true);
}

Config detail::sample_from_no_config(SampleFunctionNoConfig fn, std::string name) {
  if (!fn) throw UsageError("tune::sample_from: the function is empty");
  return add_sample_function([fn = std::move(fn)](const Config&) { return fn(); }, std::move(name),
                             false);
}

Config grid_search(const std::vector<Config>& values) {
  if (values.empty()) throw UsageError("tune::grid_search: needs at least one value");
  return Config{{"grid_search", values}};
}

bool is_domain(const Config& v) {
  if (!v.is_object() || !v.contains(kDomainKey) || !v.at(kDomainKey).is_string()) return false;
  const auto& k = v.at(kDomainKey).get_ref<const std::string&>();
  return k == "uniform" || k == "loguniform" || k == "quniform" || k == "qloguniform" ||
         k == "randn" || k == "qrandn" || k == "randint" || k == "qrandint" || k == "lograndint" ||
         k == "qlograndint" || k == "choice" || k == "sample_from";
}

bool is_grid(const Config& v) {
  return v.is_object() && v.size() == 1 && v.contains("grid_search");
}

Config sample(const Config& d, RandomSource& r) {
  if (!is_domain(d)) throw UsageError("tune::sample: not a domain: " + d.dump());
  const std::string kind = d.at(kDomainKey).get<std::string>();
  if (kind == "sample_from") {
    throw UsageError("tune::sample: " + d.dump() +
                     " is a sample_from, which needs the variant's config: generate_variants "
                     "resolves it");
  }
  if (kind == "uniform") {
    return draw_uniform(d.at("lower").get<double>(), d.at("upper").get<double>(), r);
  }
  if (kind == "loguniform") {
    return std::exp(draw_uniform(std::log(d.at("lower").get<double>()),
                                 std::log(d.at("upper").get<double>()), r));
  }
  if (kind == "quniform") {
    const double q = d.at("q").get<double>();
    const double lo = grid_index(d.at("lower").get<double>(), q, true) * q;
    const double hi = grid_index(d.at("upper").get<double>(), q, false) * q;
    return std::nearbyint(draw_uniform(lo, hi, r) / q) * q;  // np.round: half to even
  }
  if (kind == "qloguniform") {
    const double q = d.at("q").get<double>();
    const double lo = grid_index(d.at("lower").get<double>(), q, true) * q;
    const double hi = grid_index(d.at("upper").get<double>(), q, false) * q;
    return std::nearbyint(std::exp(draw_uniform(std::log(lo), std::log(hi), r)) / q) * q;
  }
  if (kind == "randn") return draw_normal(d.at("mean").get<double>(), d.at("sd").get<double>(), r);
  if (kind == "qrandn") {
    const double q = d.at("q").get<double>();
    return std::nearbyint(draw_normal(d.at("mean").get<double>(), d.at("sd").get<double>(), r) /
                          q) *
           q;
  }
  if (kind == "randint") {
    const auto lo = d.at("lower").get<std::int64_t>();
    const auto hi = d.at("upper").get<std::int64_t>();
    return lo + static_cast<std::int64_t>(r.index(static_cast<std::size_t>(hi - lo)));
  }
  if (kind == "qrandint") {
    const auto q = d.at("q").get<std::int64_t>();
    const IndexRange i =
        index_range(d.at("lower").get<std::int64_t>(), d.at("upper").get<std::int64_t>(), q);
    return (i.lo + static_cast<std::int64_t>(r.index(static_cast<std::size_t>(i.hi - i.lo)))) * q;
  }
  if (kind == "lograndint")
    return draw_log_int(d.at("lower").get<std::int64_t>(), d.at("upper").get<std::int64_t>(), r);
  if (kind == "qlograndint") {
    const auto q = d.at("q").get<std::int64_t>();
    const IndexRange i =
        index_range(d.at("lower").get<std::int64_t>(), d.at("upper").get<std::int64_t>(), q);
    return draw_log_int(i.lo, i.hi, r) * q;
  }
  const auto& cats = d.at("categories");
  return cats.at(r.index(cats.size()));
}

std::size_t count_variants(const Config& space, int num_samples) {
  std::vector<Var> grids, domains;
  collect(space, Config::json_pointer(), {}, grids, domains);
  std::size_t n = static_cast<std::size_t>(std::max(num_samples, 0));
  for (const auto& g : grids) n *= g.value->at("grid_search").size();
  return n;
}

std::vector<Config> generate_variants(const Config& space, int num_samples, RandomSource& random) {
  if (num_samples < 1) {
    throw UsageError("tune: num_samples must be >= 1, got " + std::to_string(num_samples));
  }
  check_space(space, "");
  std::vector<Var> grids, domains;
  collect(space, Config::json_pointer(), {}, grids, domains);
  // Ray sorts the grid variables by path; the first one then varies fastest.
  std::stable_sort(grids.begin(), grids.end(),
                   [](const Var& a, const Var& b) { return a.sort_key < b.sort_key; });
  std::vector<Config> out;
  for (int s = 0; s < num_samples; ++s) {
    std::vector<std::size_t> at(grids.size(), 0);
    for (;;) {
      Config c = space;
      for (std::size_t i = 0; i < grids.size(); ++i) {
        c[grids[i].pointer] = grids[i].value->at("grid_search").at(at[i]);
      }
      resolve_domains(c, domains, random);
      out.push_back(std::move(c));
      std::size_t i = 0;
      for (; i < grids.size(); ++i) {
        if (++at[i] < grids[i].value->at("grid_search").size()) break;
        at[i] = 0;
      }
      if (i == grids.size()) break;
    }
  }
  return out;
}

std::vector<Config> generate_variants(const Config& space, int num_samples, std::uint64_t seed) {
  SeededRandom r(seed);
  return generate_variants(space, num_samples, r);
}

}  // namespace dtrain::tune
