// DeepSpeed's config: strict parsing (unknown keys, types, ranges) and batch-size rules.
// The parser is one piece: DeepSpeed's schema is one tree whose sections resolve against each
// other (batch sizes, "auto", the optimizer's lr as the scheduler's default); the key tables
// and their checks stay together so one file says what dtrain accepts.
#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "dtrain/zero_config.h"
#include "zero/config_text.h"
#include "zero/data_types.h"
#include "zero/overflow_rules.h"
#include "zero/torch_scheduler_config.h"

namespace dtrain::zero {
namespace {

using nlohmann::json;

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (std::tolower(a[i - 1]) == std::tolower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// One section's reader: every access records the key as known; finish() rejects the rest.
//
// `validated`: a section DeepSpeed reads through pydantic (zero_optimization, offload_*, fp16,
// bf16): there DeepSpeed forbids unknown keys too, and drops "auto" values so the default
// applies; the reader does the same. Elsewhere DeepSpeed reads with .get() and "auto" is only
// the Hugging Face convention; an unknown key there is what DeepSpeed ignores (the top level,
// optimizer, scheduler, data_types, timers: ignores_unknown_keys) - accepted with a note unless
// it is a near-miss of a known key or the parse is strict (ParseOptions::strict) - or what a
// constructor refuses (refused_by).
class Section {
 public:
  Section(const json& j, std::string path, std::vector<std::string>* notes = nullptr,
          bool validated = false)
      : j_(j), path_(std::move(path)), notes_(notes), validated_(validated) {
    if (!j_.is_object()) fail("", "must be an object, got " + std::string(j_.type_name()));
  }
  std::vector<std::string>* notes() const { return notes_; }
  void note(const std::string& key, const std::string& what) const {
    if (notes_) notes_->push_back(where(key) + ": " + what);
  }
  std::string where(const std::string& key) const {
    return path_.empty() ? key : path_ + "." + key;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    std::string p = key.empty() ? path_ : where(key);
    throw ConfigError((p.empty() ? std::string("config") : p) + ": " + what);
  }
  const json* get(const std::string& key) {
    known_.push_back(key);
    auto it = j_.find(key);
    if (it == j_.end()) return nullptr;
    if (it->is_null()) {
      // pydantic takes null only for the fields DeepSpeed declares Optional.
      static const std::vector<std::string> optional = {
          "overlap_comm", "offload_param",     "offload_optimizer",          "zenflow",
          "cpu_offload",  "cpu_offload_param", "cpu_offload_use_pin_memory", "nvme_path"};
      if (validated_ && std::find(optional.begin(), optional.end(), key) == optional.end())
        fail(key,
             "null is not a value for this key (DeepSpeed 0.19.8 refuses it too); give a value "
             "or leave the key out");
      return nullptr;
    }
    if (validated_ && is_auto(&*it)) {
      if (std::find(auto_noted_.begin(), auto_noted_.end(), key) == auto_noted_.end()) {
        auto_noted_.push_back(key);
        const bool own = key == "stage3_prefetch_bucket_size" || key == "stage3_max_reuse_distance";
        note(key, own ? "\"auto\": dtrain's default (DeepSpeed drops \"auto\" in this section "
                        "and uses its own; the two differ for this key: docs/zero.md)"
                  : key == "overlap_comm"
                      ? "\"auto\": dtrain's default, false (DeepSpeed drops \"auto\" in this "
                        "section and uses its own: true at stage 3, false below)"
                      : "\"auto\": DeepSpeed's default (DeepSpeed drops \"auto\" in this section)");
      }
      return nullptr;
    }
    return &*it;
  }
  bool has(const std::string& key) const { return j_.contains(key); }
  static bool is_auto(const json* v) {
    return v && v->is_string() && v->get<std::string>() == "auto";
  }
  // In a validated section a value is read as pydantic's lax mode reads it (DeepSpeed 0.19.8
  // accepts "enabled": "true" and "stage": "2"), with a note; elsewhere only its JSON type.
  void boolean(const std::string& key, bool& out) {
    if (auto v = get(key)) {
      std::optional<bool> b = v->is_boolean() ? std::optional<bool>(v->get<bool>())
                              : validated_    ? lax_bool(*v)
                                              : std::nullopt;
      if (!b) fail(key, "expected true or false, got " + v->dump());
      if (!v->is_boolean()) coerced(key, *v, *b ? "true" : "false");
      out = *b;
    }
  }
  void number(const std::string& key, double& out, double lo = -INFINITY, double hi = INFINITY,
              bool allow_auto = false, bool allow_bool = true) {
    if (auto v = get(key)) {
      if (allow_auto && is_auto(v)) return;
      std::optional<double> d = v->is_number() ? std::optional<double>(v->get<double>())
                                : validated_ && (allow_bool || !v->is_boolean()) ? lax_float(*v)
                                                                                 : std::nullopt;
      if (!d) fail(key, "expected a number, got " + v->dump());
      if (!(*d >= lo && *d <= hi))
        fail(key, "out of range: " + v->dump() + " (allowed: " + range(lo, hi) + ")");
      if (!v->is_number()) coerced(key, *v, json(*d).dump());
      out = *d;
    }
  }
  // Integers; JSON numbers like 5e8 (DeepSpeed's own examples) are accepted when integral.
  // `exact`: only a JSON integer (DeepSpeed's schedulers check isinstance(value, int), so 1e3,
  // read by Python as the float 1000.0, is refused there).
  bool integer(const std::string& key, int64_t& out, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX,
               bool allow_auto = false, bool allow_bool = true, bool exact = false) {
    if (auto v = get(key)) {
      if (allow_auto && is_auto(v)) return false;
      std::optional<int64_t> i;
      if (v->is_number_integer())
        i = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                ? std::nullopt
                : std::optional<int64_t>(v->get<int64_t>());
      else if (v->is_number_float() && !exact)
        i = integral(v->get<double>());
      else if (validated_ && !v->is_number() && (allow_bool || !v->is_boolean()))
        i = lax_int(*v);
      if (!i)
        fail(key, "expected an integer, got " + v->dump() +
                      (exact && v->is_number_float()
                           ? " (DeepSpeed 0.19.8 refuses it too: it is a float to Python - "
                             "always in a config given as an object, its dict, and in a config "
                             "file or text from 1e10 on, where hjson stops reading integral "
                             "floats as ints): write it as an integer, e.g. " +
                                 (integral(v->get<double>())
                                      ? std::to_string(*integral(v->get<double>()))
                                      : std::string("1000")) +
                                 ")"
                           : std::string()));
      if (*i < lo || *i > hi)
        fail(key, "out of range: " + v->dump() + " (allowed: " + range(lo, hi) + ")");
      if (!v->is_number()) coerced(key, *v, std::to_string(*i));
      out = *i;
      return true;
    }
    return false;
  }
  void integer(const std::string& key, int& out, int64_t lo, int64_t hi) {
    int64_t v = out;
    integer(key, v, lo, hi);
    out = static_cast<int>(v);
  }
  // `allowed` values match exactly, as DeepSpeed compares them (its enums, getattr on a class
  // name); `what_deepspeed_does` is added to the refusal of any other value.
  void string(const std::string& key, std::string& out,
              const std::vector<std::string>& allowed = {},
              const std::string& what_deepspeed_does = "") {
    if (auto v = get(key)) {
      if (!v->is_string()) fail(key, "expected a string, got " + v->dump());
      std::string s = v->get<std::string>();
      if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end()) {
        std::string list;
        for (auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        std::string near = closest_key(s, allowed);
        fail(key, "unknown value \"" + s + "\" (allowed: " + list + ")" + what_deepspeed_does +
                      (near.empty() ? "" : "; did you mean " + near + "?"));
      }
      out = s;
    }
  }
  // Keys this section accepts without acting on them: only their type is checked (in a
  // validated section DeepSpeed's pydantic checks it too).
  void accept(const std::string& key) { get(key); }
  void accept_bool(const std::string& key) {
    bool b = false;
    boolean(key, b);
  }
  void accept_int(const std::string& key, int64_t lo = INT64_MIN) {
    int64_t i = 0;
    integer(key, i, lo);
  }
  // The class whose constructor DeepSpeed passes this section's keys to (optimizer and
  // scheduler params): an unknown key fails there, so the message says DeepSpeed refuses it.
  void refused_by(const std::string& who) { refused_by_ = who; }
  // A section DeepSpeed reads key by key with .get(), so that it ignores a key it does not know:
  // finish() accepts such a key with a note, unless it is a near-miss of a known key (a typo:
  // refused with "did you mean") or `strict` (every unknown key refused).
  void ignores_unknown_keys(bool strict) {
    ignores_unknown_ = true;
    strict_ = strict;
  }
  // As `parent` (the strictness of the whole parse).
  void ignores_unknown_keys_like(const Section& parent) { ignores_unknown_keys(parent.strict_); }
  // Keys DeepSpeed reads here that change nothing in dtrain: accepted with a note when set.
  void ignore(const std::string& key, const std::string& why) {
    if (get(key)) note(key, why);
  }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
      std::string near = closest_key(it.key(), known_);
      if (ignores_unknown_ && !strict_ && near.empty() && !validated_ && refused_by_.empty()) {
        note(it.key(),
             "unknown key, not read by DeepSpeed 0.19.8 (it ignores it) and ignored by dtrain "
             "too; `dtrain zero check --strict` (InitOptions::strict_config) refuses it");
        continue;
      }
      fail(it.key(),
           std::string(validated_ ? "unknown key (DeepSpeed 0.19.8 refuses it too)"
                       : !refused_by_.empty()
                           ? "unknown key (DeepSpeed 0.19.8 refuses it too: it passes the key to " +
                                 refused_by_ + ", which has no such argument)"
                       : !near.empty()
                           ? "unknown key (DeepSpeed 0.19.8 would silently ignore it; dtrain "
                             "refuses it as a likely typo of a known key: correct it)"
                           : "unknown key (DeepSpeed 0.19.8 would silently ignore it; "
                             "dtrain refuses it in strict mode so that a typo cannot go "
                             "unnoticed: remove it or correct it)") +
               (near.empty() ? std::string() : "; did you mean " + near + "?"));
    }
  }

 private:
  // pydantic 2's lax conversions (what DeepSpeed's validated sections accept).
  static std::optional<bool> lax_bool(const json& v) {
    if (v.is_number()) {
      double d = v.get<double>();
      if (d == 0 || d == 1) return d == 1;
      return std::nullopt;
    }
    if (!v.is_string()) return std::nullopt;
    std::string s = v.get<std::string>();
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    for (const char* t : {"1", "on", "t", "true", "y", "yes"})
      if (s == t) return true;
    for (const char* f : {"0", "off", "f", "false", "n", "no"})
      if (s == f) return false;
    return std::nullopt;
  }
  static std::optional<int64_t> integral(double d) {
    if (d != std::floor(d) || std::fabs(d) > 9e18) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  // A string as Python's float() reads it, or an integer string ("5", " +5 ", "5_000", "5.0").
  static std::optional<double> parse_number(std::string s, bool integer) {
    auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    if (b == std::string::npos) return std::nullopt;
    s = s.substr(b, e - b + 1);
    std::string t;  // underscores only between digits
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] != '_') {
        t += s[k];
        continue;
      }
      if (k == 0 || k + 1 == s.size() || !std::isdigit(static_cast<unsigned char>(s[k - 1])) ||
          !std::isdigit(static_cast<unsigned char>(s[k + 1])))
        return std::nullopt;
    }
    if (integer) {
      size_t k = (t[0] == '+' || t[0] == '-') ? 1 : 0, digits = 0;
      while (k < t.size() && std::isdigit(static_cast<unsigned char>(t[k]))) ++k, ++digits;
      if (k < t.size() && t[k] == '.') {
        ++k;
        while (k < t.size() && t[k] == '0') ++k;
      }
      if (digits == 0 || k != t.size()) return std::nullopt;
    }
    char* end = nullptr;
    double d = std::strtod(t.c_str(), &end);
    if (end != t.c_str() + t.size() || t.find_first_of("xX") != std::string::npos)
      return std::nullopt;
    return d;
  }
  static std::optional<int64_t> lax_int(const json& v) {
    if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
    if (!v.is_string()) return std::nullopt;
    auto d = parse_number(v.get<std::string>(), true);
    return d ? integral(*d) : std::nullopt;
  }
  static std::optional<double> lax_float(const json& v) {
    if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
    if (!v.is_string()) return std::nullopt;
    return parse_number(v.get<std::string>(), false);
  }
  void coerced(const std::string& key, const json& given, const std::string& as) const {
    note(key, given.dump() + " read as " + as + " (DeepSpeed's pydantic converts it the same way)");
  }
  static std::string range(double lo, double hi) {
    std::ostringstream s;
    if (std::isinf(lo))
      s << "<= " << hi;
    else if (std::isinf(hi))
      s << ">= " << lo;
    else
      s << lo << " .. " << hi;
    return s.str();
  }
  static std::string range(int64_t lo, int64_t hi) {
    if (lo == INT64_MIN) return "<= " + std::to_string(hi);
    if (hi == INT64_MAX) return ">= " + std::to_string(lo);
    return std::to_string(lo) + " .. " + std::to_string(hi);
  }
  const json& j_;
  std::string path_;
  std::vector<std::string>* notes_;
  bool validated_;
  std::string refused_by_;
  bool ignores_unknown_ = false, strict_ = true;
  std::vector<std::string> known_, auto_noted_;
};

void parse_offload(Section& parent, const std::string& key, OffloadConfig& out, bool param) {
  if (auto v = parent.get(key)) {
    Section s(*v, parent.where(key), parent.notes(), true);
    s.string("device", out.device, {"none", "cpu", "nvme"});
    if (out.device == "nvme")
      s.fail("device",
             "\"nvme\" offload (DeepSpeed's ZeRO-Infinity, swapping to NVMe through libaio) is not "
             "supported by dtrain; use \"cpu\"");
    s.boolean("pin_memory", out.pin_memory);
    if (auto p = s.get("nvme_path"); p && !p->is_string())
      s.fail("nvme_path", "expected a path (a string), got " + p->dump());
    for (const char* k : {"buffer_count", "buffer_size", "max_in_cpu"}) s.accept_int(k, 0);
    if (!param) {
      for (const char* k : {"pipeline_read", "pipeline_write", "fast_init"}) s.accept_bool(k);
      double ratio = 1.0;
      s.number("ratio", ratio, 0, 1);
      if (ratio < 1.0)
        s.fail("ratio",
               "partial optimizer offload (ratio < 1) is not supported by dtrain; use 1.0");
      bool super_offload = false;
      s.boolean("super_offload", super_offload);
      if (super_offload)
        s.note("super_offload", "DeepSpeed's SuperOffload for superchips; dtrain offloads plainly");
      double cores = 0.8;
      s.number("cpuadam_cores_perc", cores, 0, 1);
      if (s.has("cpuadam_cores_perc"))
        s.note("cpuadam_cores_perc",
               "the share of cores DeepSpeed's CPU Adam uses; dtrain's "
               "CPU Adam uses libtorch's intra-op threads");
    }
    s.finish();
  }
}

// The optimizer types DeepSpeed 0.19.8 has that dtrain does not run, and what to use. DeepSpeed
// matches these (its own optimizers) in any case: it lowercases the name.
const std::map<std::string, std::string>& other_optimizers() {
  static const std::map<std::string, std::string> m = {
      {"muadam", "muP's optimizers need the mup package; use Adam"},
      {"muadamw", "muP's optimizers need the mup package; use AdamW"},
      {"musgd", "muP's optimizers need the mup package; use SGD"},
      {"muon", "use Adam, AdamW, SGD or Lamb"}};
  return m;
}

// Every other type DeepSpeed 0.19.8 looks up in torch.optim by its exact name (RMSprop, which
// libtorch has, is run; these libtorch has not, or LBFGS, whose step needs a closure).
const std::vector<std::string>& torch_optimizers() {
  static const std::vector<std::string> v = {"Adadelta",   "Adafactor", "Adamax", "ASGD",
                                             "LBFGS",      "NAdam",     "RAdam",  "Rprop",
                                             "SparseAdam", "Muon"};
  return v;
}

std::string lower(std::string s) {
  for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// An optimizer param given as "auto": the optimizer's default, with a note.
bool auto_default(Section& ps, const std::string& key, const std::string& value) {
  if (!Section::is_auto(ps.get(key))) return false;
  ps.note(key, "\"auto\": " + value +
                   " (the optimizer's default; Hugging Face's integration "
                   "would fill in its training argument)");
  return true;
}

// The optimizer's type as DeepSpeed 0.19.8 resolves it: its own optimizers (Adam, AdamW, Lamb,
// Adagrad, ...) in any case, torch.optim's (SGD, ...) by their exact name.
std::string optimizer_type(Section& s) {
  auto t = s.get("type");
  if (!t)
    s.fail("type",
           "missing (one of Adam, AdamW, SGD, Lamb, Adagrad, Lion); DeepSpeed 0.19.8 would "
           "silently "
           "ignore an "
           "optimizer section without a type, and dtrain refuses it so that a typo cannot go "
           "unnoticed");
  if (!t->is_string()) s.fail("type", "expected a string, got " + t->dump());
  const std::string name = t->get<std::string>();
  const std::string low = lower(name);
  if (low == "adam") return "Adam";
  if (low == "adamw") return "AdamW";
  if (low == "lamb") return "Lamb";
  if (low == "adagrad") return "Adagrad";
  if (low == "lion") return "Lion";
  if (name == "SGD") return "SGD";
  if (name == "RMSprop") return "RMSprop";  // torch.optim's, by its exact name
  if (auto it = other_optimizers().find(low); it != other_optimizers().end())
    s.fail("type",
           "DeepSpeed's " + name + " optimizer is not implemented by dtrain: " + it->second);
  const auto& torch_names = torch_optimizers();
  if (std::find(torch_names.begin(), torch_names.end(), name) != torch_names.end())
    s.fail("type",
           "torch.optim." + name +
               " (DeepSpeed 0.19.8 builds it by name) is not implemented by dtrain's "
               "config: pass a torch::optim::" +
               name +
               " as InitOptions::optimizer, or use Adam, AdamW, SGD, Lamb, Adagrad, Lion or "
               "RMSprop");
  if (low == "onebitadam" || low == "zerooneadam" || low == "onebitlamb")
    s.fail("type", "DeepSpeed 0.19.8 has no " + name +
                       " optimizer any more (its compressed-communication optimizers were "
                       "removed; it refuses the name too): use " +
                       (low == "onebitlamb" ? "Lamb" : "Adam") +
                       " (the same update, uncompressed)");
  std::string near =
      closest_key(name, {"Adam", "AdamW", "SGD", "Lamb", "Adagrad", "Lion", "RMSprop"});
  s.fail("type", "unknown value \"" + name +
                     "\" (allowed: Adam, AdamW, SGD, Lamb, Adagrad, Lion, RMSprop; DeepSpeed "
                     "0.19.8 refuses it too: it matches Adam, AdamW, Lamb, Adagrad and Lion in any "
                     "case, SGD, RMSprop and torch.optim's other names only exactly)" +
                     (near.empty() ? "" : "; did you mean " + near + "?"));
}

void parse_optimizer(Section& root, Config& c) {
  auto v = root.get("optimizer");
  if (!v) {
    if (root.has("optimizer"))
      root.fail("optimizer",
                "null (DeepSpeed 0.19.8 fails on it too): give an object or leave the key out");
    return;
  }
  Section s(*v, "optimizer", root.notes());
  s.ignores_unknown_keys_like(root);
  auto& o = c.optimizer;
  o.given = true;
  o.type = optimizer_type(s);
  const bool adagrad = o.type == "Adagrad";
  if (adagrad) {  // torch.optim.Adagrad's defaults, and DeepSpeedCPUAdagrad's
    o.lr = 1e-2;
    o.eps = 1e-10;
  }
  const bool rmsprop = o.type == "RMSprop";
  if (rmsprop) o.lr = 1e-2;  // torch.optim.RMSprop's default
  if (auto p = s.get("params")) {
    Section ps(*p, "optimizer.params", root.notes());
    if (ps.has("max_grad_norm"))
      ps.fail("max_grad_norm",
              "not an optimizer parameter (DeepSpeed refuses it too); use the top-level "
              "\"gradient_clipping\"");
    const bool adam = o.type == "Adam" || o.type == "AdamW";
    bool torch_adam = false;
    if (adam) ps.boolean("torch_adam", torch_adam);
    o.torch_adam = torch_adam;
    // The constructor DeepSpeed 0.19.8 passes the params to (with offload_optimizer: its CPU
    // Adam, whose arguments are FusedAdam's but set_grad_none; checked in parse_config).
    ps.refused_by(adam              ? (torch_adam ? (o.type == "AdamW" ? "torch.optim.AdamW"
                                                                       : "torch.optim.AdamW (or Adam)")
                                                  : "FusedAdam")
                  : o.type == "SGD" ? "torch.optim.SGD"
                  : rmsprop         ? "torch.optim.RMSprop"
                  : adagrad ? "torch.optim.Adagrad (with offload_optimizer its DeepSpeedCPUAdagrad)"
                  : o.type == "Lion" ? "FusedLion (with offload_optimizer its DeepSpeedCPULion)"
                                     : "FusedLamb");
    // torch.optim.AdamW's default weight decay is 0.01 (DeepSpeed's optimizers' is 0); with
    // torch_adam DeepSpeed 0.19.8 builds AdamW for "AdamW", and for "Adam" unless adam_w_mode is
    // false.
    bool w_mode = true;
    if (o.type == "Adam") {
      if (auto m = ps.get("adam_w_mode"); m && m->is_boolean()) w_mode = m->get<bool>();
    }
    if (adam && torch_adam && w_mode) {
      o.weight_decay = 0.01;
      if (!ps.has("weight_decay"))
        ps.note("weight_decay",
                "not given: 0.01, torch.optim.AdamW's default (torch_adam; DeepSpeed 0.19.8 "
                "builds torch.optim.AdamW)");
    }
    const std::string wd_default = json(o.weight_decay).dump();
    if (!auto_default(ps, "lr", adagrad || rmsprop ? "1e-2" : "1e-3")) ps.number("lr", o.lr, 0);
    if (!auto_default(ps, "weight_decay", wd_default)) ps.number("weight_decay", o.weight_decay, 0);
    auto betas = [&] {
      if (auto_default(ps, "betas", "[0.9, 0.999]")) return;
      if (auto b = ps.get("betas")) {
        if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
          ps.fail("betas", "expected [beta1, beta2], got " + b->dump());
        o.beta1 = (*b)[0].get<double>();
        o.beta2 = (*b)[1].get<double>();
        if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1)
          ps.fail("betas", "each beta must be in [0, 1), got " + b->dump());
      }
    };
    if (rmsprop) {
      // torch.optim.RMSprop(lr, alpha, eps, weight_decay, momentum, centered, capturable,
      // foreach, maximize, differentiable); its constructor refuses negative values.
      if (!auto_default(ps, "eps", "1e-8")) ps.number("eps", o.eps, 0);
      ps.number("alpha", o.alpha, 0);
      ps.number("momentum", o.momentum, 0);
      ps.boolean("centered", o.centered);
      for (const char* k : {"capturable", "foreach", "differentiable"}) ps.accept(k);
      if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
        ps.fail("maximize", "not supported by dtrain; negate the loss instead");
    } else if (o.type == "Lion") {
      // DeepSpeedCPULion(lr, betas, weight_decay, fp32_optimizer_states): decoupled decay,
      // fp32 momentum (it steps the fp32 master, so its states are fp32 either way).
      betas();
      ps.accept_bool("fp32_optimizer_states");
      // FusedLion(lr, betas, weight_decay, set_grad_none) without offload_optimizer (the same
      // update); check_engine_rules refuses the key the one built for this config does not take.
      ps.accept_bool("set_grad_none");
    } else if (adagrad) {
      // The union of torch.optim.Adagrad's arguments and DeepSpeedCPUAdagrad's; parse_config
      // refuses those the one built for this config (offload_optimizer or not) does not take.
      if (!auto_default(ps, "eps", "1e-10")) ps.number("eps", o.eps, 0);
      ps.number("lr_decay", o.lr_decay, 0);
      ps.number("initial_accumulator_value", o.initial_accumulator_value, 0);
      // torch's implementation choices: the same formula.
      for (const char* k : {"foreach", "fused", "differentiable"}) ps.accept(k);
      if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
        ps.fail("maximize", "not supported by dtrain; negate the loss instead");
      // DeepSpeedCPUAdagrad keeps amsgrad in its group and never reads it; its states are fp32
      // by default, and with offload it steps the fp32 master, so they are fp32 either way.
      bool amsgrad = false;
      ps.boolean("amsgrad", amsgrad);
      if (amsgrad)
        ps.note(
            "amsgrad",
            "DeepSpeed 0.19.8's CPU Adagrad takes it and never reads it; no effect here either");
      ps.accept_bool("fp32_optimizer_states");
    } else if (o.type != "SGD") {
      if (!auto_default(ps, "eps", "1e-8")) ps.number("eps", o.eps, 0);
      betas();
      // torch.optim's Adam has no bias_correction: it always corrects.
      if (!torch_adam) ps.boolean("bias_correction", o.bias_correction);
      if (adam) {
        // DeepSpeed: "AdamW" is decoupled whatever adam_w_mode says; "Adam" too unless false.
        ps.boolean("adam_w_mode", o.adam_w_mode);
        if (o.type == "AdamW") o.adam_w_mode = true;
        if (auto a = ps.get("amsgrad"); a && a->is_boolean() && a->get<bool>())
          ps.fail("amsgrad",
                  "not supported by dtrain (DeepSpeed's FusedAdam refuses it too; torch_adam's "
                  "runs it); remove it");
        ps.accept_bool("fp32_optimizer_states");  // DeepSpeed's CPU Adam: fp32 moments, as here
        if (torch_adam) {
          // torch.optim.Adam(W)'s implementation choices: the same formula.
          for (const char* k : {"foreach", "fused", "capturable", "differentiable"}) ps.accept(k);
          if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
            ps.fail("maximize", "not supported by dtrain; negate the loss instead");
        } else {
          ps.accept_bool("set_grad_none");  // FusedAdam's: how it zeroes gradients
        }
      }
      if (o.type == "Lamb") {
        ps.number("max_coeff", o.max_coeff, 0);
        ps.number("min_coeff", o.min_coeff, 0);
        if (auto a = ps.get("amsgrad"); a && a->is_boolean() && a->get<bool>())
          ps.fail("amsgrad", "not supported by dtrain; remove it");
        if (auto e = ps.get("eps_inside_sqrt"); e && e->is_boolean() && e->get<bool>())
          ps.fail("eps_inside_sqrt", "not supported by dtrain (eps is added outside the sqrt)");
      }
    } else {
      ps.number("momentum", o.momentum, 0);
      ps.number("dampening", o.dampening);
      ps.boolean("nesterov", o.nesterov);
      for (const char* k : {"foreach", "differentiable", "fused"}) ps.accept(k);
      if (auto m = ps.get("maximize"); m && m->is_boolean() && m->get<bool>())
        ps.fail("maximize", "not supported by dtrain; negate the loss instead");
      if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
        ps.fail("nesterov",
                "Nesterov momentum needs a momentum > 0 and dampening 0 (torch.optim.SGD, which "
                "DeepSpeed 0.19.8 builds, refuses it too); momentum is " +
                    json(o.momentum).dump() + ", dampening " + json(o.dampening).dump());
    }
    ps.finish();
  }
  s.ignore("legacy_fusion", "DeepSpeed's legacy fused fp16 optimizer path; no effect in dtrain");
  s.finish();
}

// A scheduler param that Hugging Face fills in from its training arguments: "auto" cannot be
// resolved standalone.
void no_auto(Section& ps, const std::string& key, const std::string& what) {
  if (Section::is_auto(ps.get(key)))
    ps.fail(key,
            "\"auto\" is filled in by Hugging Face's Trainer / accelerate from the training "
            "arguments, which dtrain does not have; give " +
                what);
}

void parse_scheduler(Section& root, Config& c) {
  auto v = root.get("scheduler");
  if (!v) {
    if (root.has("scheduler"))
      root.fail("scheduler",
                "null (DeepSpeed 0.19.8 fails on it too): give an object or leave the key out");
    return;
  }
  Section s(*v, "scheduler", root.notes());
  s.ignores_unknown_keys_like(root);
  auto& sc = c.scheduler;
  if (!s.get("type"))
    s.fail("type",
           "missing (one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest); "
           "DeepSpeed 0.19.8 would silently ignore a scheduler section without a type, and dtrain "
           "refuses it so that a typo cannot go unnoticed");
  // DeepSpeed 0.19.8 looks the type up by its exact name in its lr_schedules (DeepSpeed's
  // OneCycle, ...), then in torch.optim.lr_scheduler (torch's OneCycleLR, StepLR, ...).
  if (auto t = s.get("type"); t->is_string()) {
    const std::string name = t->get<std::string>();
    if (const std::string why = detail::torch_scheduler_refusal(name); !why.empty())
      s.fail("type",
             "torch.optim.lr_scheduler." + name +
                 " (DeepSpeed 0.19.8 builds it by name) is not supported by dtrain: " + why +
                 "; use StepLR, MultiStepLR, ExponentialLR, CosineAnnealingLR, LinearLR, "
                 "ConstantLR, PolynomialLR, CosineAnnealingWarmRestarts, OneCycleLR or "
                 "DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, "
                 "LRRangeTest");
    if (detail::is_torch_scheduler_name(name)) {
      sc.type = name;
      if (!s.has("params") || s.get("params") == nullptr || s.get("params")->is_null())
        s.fail("params", "missing (DeepSpeed 0.19.8 fails without it too: it calls " + name +
                             "(optimizer, **params))");
      detail::parse_torch_scheduler(s.get("params"), c.optimizer, sc);
      s.finish();
      return;
    }
  }
  s.string("type", sc.type,
           {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"},
           " (DeepSpeed 0.19.8 refuses it too: it looks the scheduler up by its exact name)");
  const auto& t = sc.type;
  if (!s.has("params") || s.get("params") == nullptr)
    s.fail("params", "missing (DeepSpeed 0.19.8 fails without it too: it calls " + t +
                         "(optimizer, **params)); give \"params\": {} for " + t + "'s defaults");
  // DeepSpeed's warm-up: log or linear; another value (or another case) makes it warn and warm
  // up by log.
  const std::string warmup_other =
      "; DeepSpeed 0.19.8 would warn and warm up by log instead, and dtrain refuses it so that "
      "a typo cannot go unnoticed";
  if (auto p = s.get("params")) {
    Section ps(*p, "scheduler.params", root.notes());
    ps.refused_by(t + "'s constructor");
    if (auto l = ps.get("last_batch_iteration"); l && !(l->is_number_integer() && *l == -1))
      ps.fail("last_batch_iteration",
              "a start other than -1 (the beginning) is not supported by dtrain; a resumed run "
              "takes the scheduler's position from its checkpoint");
    if (t == "WarmupLR" || t == "WarmupDecayLR") {
      if (Section::is_auto(ps.get("warmup_min_lr"))) {
        ps.note("warmup_min_lr", "\"auto\": 0 (DeepSpeed's default)");
      } else {
        ps.number("warmup_min_lr", sc.warmup_min_lr, 0);
      }
      // "auto": the optimizer's lr, as Hugging Face's integration fills it in.
      if (auto m = ps.get("warmup_max_lr"); Section::is_auto(m)) {
        sc.warmup_max_lr = c.optimizer.lr;
        ps.note("warmup_max_lr", "\"auto\": the optimizer's lr");
      } else if (m) {
        double val = 0;
        ps.number("warmup_max_lr", val, 0);
        sc.warmup_max_lr = val;
      }
      no_auto(ps, "warmup_num_steps", "the number of warm-up steps");
      ps.integer("warmup_num_steps", sc.warmup_num_steps, 1, INT64_MAX, false, true, true);
      ps.string("warmup_type", sc.warmup_type, {"log", "linear"}, warmup_other);
      if (t == "WarmupDecayLR") {
        no_auto(ps, "total_num_steps", "the number of optimizer steps of the whole run");
        ps.integer("total_num_steps", sc.total_num_steps, 1);
      }
    } else if (t == "WarmupCosineLR") {
      no_auto(ps, "total_num_steps", "the number of optimizer steps of the whole run");
      ps.integer("total_num_steps", sc.total_num_steps, 1);
      ps.number("warmup_min_ratio", sc.warmup_min_ratio, 0, 1);
      no_auto(ps, "warmup_num_steps", "the number of warm-up steps");
      ps.integer("warmup_num_steps", sc.warmup_num_steps, 1, INT64_MAX, false, true, true);
      ps.number("cos_min_ratio", sc.cos_min_ratio, 0, 1);
      ps.string("warmup_type", sc.warmup_type, {"log", "linear"}, warmup_other);
    } else if (t == "OneCycle") {
      ps.number("cycle_min_lr", sc.cycle_min_lr, 0);
      ps.number("cycle_max_lr", sc.cycle_max_lr, 0);
      ps.number("decay_lr_rate", sc.decay_lr_rate, 0);
      ps.integer("cycle_first_step_size", sc.cycle_first_step_size, 1);
      ps.integer("cycle_second_step_size", sc.cycle_second_step_size, 0);
      ps.integer("cycle_first_stair_count", sc.cycle_first_stair_count, 0);
      ps.integer("cycle_second_stair_count", sc.cycle_second_stair_count, 0);
      ps.integer("decay_step_size", sc.decay_step_size, 0);
      ps.boolean("cycle_momentum", sc.cycle_momentum);
      ps.number("cycle_min_mom", sc.cycle_min_mom, 0, 1);
      ps.number("cycle_max_mom", sc.cycle_max_mom, 0, 1);
      ps.number("decay_mom_rate", sc.decay_mom_rate, 0);
    } else {
      ps.number("lr_range_test_min_lr", sc.lr_range_test_min_lr, 0);
      ps.integer("lr_range_test_step_size", sc.lr_range_test_step_size, 1, INT64_MAX, false, true,
                 true);
      ps.number("lr_range_test_step_rate", sc.lr_range_test_step_rate, 0);
      ps.boolean("lr_range_test_staircase", sc.lr_range_test_staircase);
    }
    ps.finish();
  }
  if ((t == "WarmupDecayLR" || t == "WarmupCosineLR") && sc.total_num_steps <= 0)
    s.fail("params.total_num_steps", "required by " + t + " (a positive integer)");
  if (t == "OneCycle" && (!v->contains("params") || !(*v)["params"].contains("cycle_min_lr") ||
                          !(*v)["params"].contains("cycle_max_lr")))
    s.fail("params", "OneCycle needs cycle_min_lr and cycle_max_lr (DeepSpeed has no default)");
  s.finish();
}

// What DeepSpeed 0.19.8's engine decides about the optimizers and schedulers it builds by name
// from torch.optim, once ZeRO and the precision are known. dtrain runs both where DeepSpeed
// stops, and says so in a note.
void check_by_name_rules(Section& root, Config& c) {
  const json& raw = c.raw;
  bool untested_ok = false;
  if (auto u = raw.find("zero_allow_untested_optimizer"); u != raw.end() && u->is_boolean())
    untested_ok = u->get<bool>();
  if (c.optimizer.given && c.optimizer.type == "RMSprop" && c.zero.stage > 0 && !untested_ok)
    root.note("optimizer",
              "RMSprop under ZeRO: dtrain runs it; DeepSpeed 0.19.8 would refuse it (an untested "
              "ZeRO optimizer) without \"zero_allow_untested_optimizer\": true");
  // Its engine hands the scheduler the optimizer it wraps for ZeRO, fp16 or bf16 (not a
  // torch.optim.Optimizer), which torch 2.11's schedulers reject in their constructor.
  if (c.scheduler.is_torch() && (c.zero.stage > 0 || c.fp16.enabled || c.bf16)) {
    const std::string wrapper = c.zero.stage > 0 ? "ZeRO stage " + std::to_string(c.zero.stage)
                                : c.fp16.enabled ? std::string("fp16")
                                                 : std::string("bf16");
    root.note("scheduler", "torch.optim.lr_scheduler." + c.scheduler.type + " with " + wrapper +
                               ": dtrain runs it; DeepSpeed 0.19.8 would refuse it (it passes "
                               "its " +
                               wrapper +
                               " optimizer wrapper, which torch's scheduler rejects: "
                               "TypeError \"... is not an Optimizer\")");
  }
}

// zero_optimization's renamed and deprecated keys DeepSpeed 0.19.8 still takes: (alias, name).
const std::vector<std::pair<std::string, std::string>>& zero_aliases() {
  static const std::vector<std::pair<std::string, std::string>> a = {
      {"prefetch_bucket_size", "stage3_prefetch_bucket_size"},
      {"param_persistence_threshold", "stage3_param_persistence_threshold"},
      {"max_live_parameters", "stage3_max_live_parameters"},
      {"max_reuse_distance", "stage3_max_reuse_distance"},
      {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"},
      {"stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"},
      {"model_persistence_threshold", "stage3_model_persistence_threshold"},
      {"module_granularity_threshold", "stage3_module_granularity_threshold"},
      {"use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"},
      {"allgather_sequential", "stage3_allgather_sequential"}};
  return a;
}

// `unused`: the keys given that dtrain reads but does not act on (one note names them all).
void parse_zero(Section& root, Config& c, std::vector<std::string>& unused) {
  auto v = root.get("zero_optimization");
  if (!v) {
    if (root.has("zero_optimization"))
      root.fail("zero_optimization",
                "null (DeepSpeed 0.19.8 fails on it too): give an object or leave the key out");
    return;
  }
  auto& z = c.zero;
  if (v->is_boolean()) {
    // DeepSpeed's oldest format: true is stage 1 (allgather_size the bucket).
    z.stage = v->get<bool>() ? 1 : 0;
    if (auto a = root.get("allgather_size"); a && a->is_number())
      z.allgather_bucket_size = a->get<int64_t>();
    root.note("zero_optimization", "deprecated boolean form: stage " + std::to_string(z.stage));
    return;
  }
  Section s(*v, "zero_optimization", root.notes(), true);
  for (const char* k : {"mics_shard_size", "mics_hierarchical_params_gather"})
    if (s.has(k))
      s.fail(k,
             "MiCS ZeRO-3 sharding was removed from DeepSpeed (0.19.8 refuses it too); remove "
             "the key");
  if (s.has("zeropp_loco_param"))
    s.fail("zeropp_loco_param",
           "LoCo-Zero++ was removed from DeepSpeed (0.19.8 refuses it too); remove the key");
  // An alias and its name in one config: DeepSpeed's pydantic refuses that as well.
  json zj = *v;
  for (const auto& [alias, name] : zero_aliases()) {
    if (!zj.contains(alias)) continue;
    if (zj.contains(name))
      s.fail(alias, "given together with " + name + ", its other name; keep one of them");
    zj[name] = zj[alias];
    zj.erase(alias);
    if (alias.rfind("stage3_gather_fp16", 0) == 0) s.note(alias, "deprecated name of " + name);
  }
  Section zs(zj, "zero_optimization", root.notes(), true);
  for (const auto& [alias, name] : zero_aliases()) zs.accept(alias);
  zs.integer("stage", z.stage, 0, 3);
  // DeepSpeed's default is (stage == 3); dtrain's stays false (the same result; stage 3's
  // per-layer fetch already overlaps, and a bucket in flight holds its own buffer).
  zs.boolean("overlap_comm", z.overlap_comm);
  zs.boolean("contiguous_gradients", z.contiguous_gradients);
  zs.boolean("reduce_scatter", z.reduce_scatter);
  zs.integer("reduce_bucket_size", z.reduce_bucket_size, 1);
  zs.integer("allgather_bucket_size", z.allgather_bucket_size, 0);
  zs.accept_bool("allgather_partitions");
  // dtrain's buffers are contiguous, it reduces to owners and gathers in place whatever these say.
  for (const char* k :
       {"contiguous_gradients", "reduce_scatter", "allgather_bucket_size", "allgather_partitions"})
    if (zs.get(k)) unused.push_back(zs.where(k));
  zs.integer("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0);
  zs.integer("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0);
  zs.integer("stage3_max_live_parameters", z.stage3_max_live_parameters, 0);
  zs.integer("stage3_max_reuse_distance", z.stage3_max_reuse_distance, 0);
  zs.boolean("stage3_gather_16bit_weights_on_model_save",
             z.stage3_gather_16bit_weights_on_model_save);
  zs.integer("sub_group_size", z.sub_group_size, 0);
  // Tuning of DeepSpeed's own implementation: no effect on the result (type-checked as
  // DeepSpeed does).
  for (const char* k :
       {"round_robin_gradients", "load_from_fp32_weights", "ignore_unused_parameters",
        "legacy_stage1", "use_multi_rank_bucket_allreduce",
        "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential",
        "parameter_alignment", "memory_efficient_linear", "pipeline_loading_checkpoint",
        "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
        "save_muon_momentum_buffer_in_memory"}) {
    zs.accept_bool(k);
    if (zs.has(k)) unused.push_back(zs.where(k));
  }
  zs.accept_int("stage3_model_persistence_threshold", 0);
  zs.accept_int("stage3_module_granularity_threshold");
  for (const char* k :
       {"stage3_model_persistence_threshold", "stage3_module_granularity_threshold", "leaf_module"})
    if (zs.has(k)) unused.push_back(zs.where(k));
  zs.accept("leaf_module");
  zs.boolean("compute_grad_norm", z.compute_grad_norm);
  if (!z.compute_grad_norm && z.stage != 1 && z.stage != 2)
    zs.fail("compute_grad_norm",
            "false is supported only at stage 1 or 2 (DeepSpeed 0.19.8 refuses it at stage " +
                std::to_string(z.stage) + " too); remove it");
  bool elastic = false;
  zs.boolean("elastic_checkpoint", elastic);
  if (elastic)
    zs.note("elastic_checkpoint",
            "deprecated in DeepSpeed; dtrain's checkpoints load at any world size anyway");
  for (const char* k : {"zero_quantized_weights", "zero_quantized_nontrainable_weights",
                        "zero_quantized_gradients"}) {
    bool q = false;
    zs.boolean(k, q);
    if (q)
      zs.note(k,
              "ZeRO++ quantized communication; dtrain communicates unquantized (same "
              "result, more bytes)");
  }
  int64_t hpz = 1;
  zs.integer("zero_hpz_partition_size", hpz, 0);
  if (hpz > 1)
    zs.note("zero_hpz_partition_size",
            "ZeRO++ hierarchical partitioning; dtrain partitions over the whole group");
  zs.ignore("zenflow", "DeepSpeed's ZenFlow (stall-free offloading); dtrain offloads plainly");
  // Deprecated booleans, with DeepSpeed's meaning.
  bool cpu_offload = false, cpu_offload_param = false, pin = false;
  zs.boolean("cpu_offload", cpu_offload);
  zs.boolean("cpu_offload_param", cpu_offload_param);
  bool pin_given = zs.has("cpu_offload_use_pin_memory");
  zs.boolean("cpu_offload_use_pin_memory", pin);
  parse_offload(zs, "offload_optimizer", z.offload_optimizer, false);
  parse_offload(zs, "offload_param", z.offload_param, true);
  // A deprecated boolean: DeepSpeed maps it to its section with device cpu.
  auto alias = [&](bool on, const std::string& flag, const std::string& section,
                   OffloadConfig& out) {
    // Given at all (false too) beside its replacement: DeepSpeed refuses the pair.
    if (zs.get(flag) && zs.has(section))
      zs.fail(flag, "given together with " + section +
                        ", which replaces it (DeepSpeed 0.19.8 refuses the pair too); keep " +
                        section);
    if (!on) return;
    out.device = "cpu";  // pin_memory stays at its default, true, as in DeepSpeed
    zs.note(flag, "deprecated: " + section + " {\"device\": \"cpu\"}");
  };
  alias(cpu_offload, "cpu_offload", "offload_optimizer", z.offload_optimizer);
  alias(cpu_offload_param, "cpu_offload_param", "offload_param", z.offload_param);
  if (pin_given)
    zs.note("cpu_offload_use_pin_memory",
            "deprecated, and ignored: DeepSpeed 0.19.8 reads it into nothing (pin_memory of the "
            "offload sections, true by default, decides)");
  zs.finish();
  if (z.offload_param.enabled() && z.stage != 3)
    zs.note("offload_param", "has no effect at stage " + std::to_string(z.stage) +
                                 " (parameters are partitioned, and offloaded, only at stage "
                                 "3); DeepSpeed 0.19.8 accepts it and ignores it too");
  if (z.offload_optimizer.enabled() && z.stage == 0)
    zs.note("offload_optimizer",
            "at stage 0: DeepSpeed's CPU optimizer (DeepSpeedCPUAdam, DeepSpeedCPUAdagrad or "
            "DeepSpeedCPULion) steps the whole, unpartitioned model, its state in CPU memory, as "
            "DeepSpeed 0.19.8 does (which steps the module's own parameters, so only a model on "
            "the CPU; dtrain steps an fp32 copy in CPU memory, so a CUDA model too); stage 1, 2 "
            "or 3 partition the state over the ranks");
}

}  // namespace

bool skips_nonfinite_steps(const Config& c) {
  if (c.fp16.enabled) return true;
  const int stage = c.zero.stage;
  if (stage == 0) return c.bf16;
  if (stage >= 3) return true;
  if (!c.bf16) return c.zero.compute_grad_norm;
  if (stage == 1 && c.data_types.grad_accum_dtype == "fp32" && !c.zero.offload_optimizer.enabled())
    return true;  // BF16_Optimizer: whatever check_grad_overflow says
  // bf16.check_grad_overflow as parse_config read it (lax, already validated).
  bool check = true;
  const auto bf16 = c.raw.find("bf16");
  const char* section = bf16 != c.raw.end() && !bf16->is_null() ? "bf16" : "bfloat16";
  if (auto it = c.raw.find(section); it != c.raw.end() && it->is_object()) {
    std::vector<std::string> scratch;
    Section(*it, section, &scratch, true).boolean("check_grad_overflow", check);
  }
  return check;
}

GradNormReport grad_norm_report(const Config& c) {
  const int stage = c.zero.stage;
  const bool mixed = c.fp16.enabled || c.bf16;
  if (stage == 0) {
    if (!mixed) return GradNormReport::kNone;
    const auto& opt = c.optimizer;
    const bool fused = (opt.type == "Adam" || opt.type == "AdamW") && !opt.torch_adam &&
                       !c.zero.offload_optimizer.enabled();
    return fused ? GradNormReport::kAfterUpdate : GradNormReport::kScaled;
  }
  if (stage >= 3) return GradNormReport::kAfterUpdate;
  if (c.bf16 && stage == 1 && c.data_types.grad_accum_dtype == "fp32" &&
      !c.zero.offload_optimizer.enabled())
    return GradNormReport::kUnscaled;  // BF16_Optimizer
  return c.zero.compute_grad_norm ? GradNormReport::kUnscaled : GradNormReport::kNone;
}

std::string communication_data_type(const Config& c) {
  const auto it = c.raw.find("communication_data_type");
  if (it == c.raw.end() || !it->is_string()) return "";
  std::string name = it->get<std::string>();
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return name;
}

std::string keep_in_fp32_regex(const std::vector<std::string>& patterns) {
  std::vector<std::string> sorted;  // as DeepSpeed's keep_in_fp32_pattern: '*' any characters,
  for (const auto& p : patterns) {  // the distinct patterns sorted, one alternation
    std::string r;
    for (char ch : p) r += ch == '*' ? std::string(".*") : std::string(1, ch);
    sorted.push_back(r);
  }
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string joined;
  for (const auto& r : sorted) joined += (joined.empty() ? "" : "|") + r;
  return joined;
}

namespace {

// DeepSpeed's DtypeEnum spellings (exact, as its enum compares them) -> its canonical name.
std::optional<std::string> deepspeed_dtype(const json& v) {
  if (!v.is_string()) return std::nullopt;
  static const std::vector<std::pair<std::string, std::string>> names = {
      {"torch.float16", "fp16"}, {"fp16", "fp16"}, {"float16", "fp16"},        {"half", "fp16"},
      {"torch.float32", "fp32"}, {"fp32", "fp32"}, {"float32", "fp32"},        {"float", "fp32"},
      {"torch.int8", "int8"},    {"int8", "int8"}, {"torch.bfloat16", "bf16"}, {"bf16", "bf16"},
      {"bfloat16", "bf16"}};
  for (const auto& [spelling, name] : names)
    if (v.get<std::string>() == spelling) return name;
  return std::nullopt;
}

// "data_types": DeepSpeed 0.19.8 reads it with .get() (an unknown key is ignored there) and
// checks each value where its engine uses it: param_dtype always, buffer_dtype and
// keep_in_fp32_modules under fp16/bf16 only, grad_accum_dtype when it builds the optimizer
// (dtrain always has one).
void parse_data_types(Section& root, Config& c) {
  if (!root.has("data_types")) return;
  const json* v = root.get("data_types");
  if (!v)
    root.fail("data_types",
              "null (DeepSpeed 0.19.8 fails on it too): give an object or leave it out");
  Section s(*v, "data_types", root.notes());
  s.ignores_unknown_keys_like(root);
  auto& d = c.data_types;
  const std::string model = c.fp16.enabled ? "fp16" : c.bf16 ? "bf16" : "fp32";
  const bool mixed = model != "fp32";
  const std::string spellings =
      "fp16/float16/half, bf16/bfloat16, fp32/float32/float, or with a torch. prefix";
  // `checked`: whether DeepSpeed refuses a value it cannot read here, or never reads it.
  auto dtype = [&](const std::string& key, bool checked) -> std::string {
    const json* t = s.get(key);
    if (!t) return "";
    if (auto name = deepspeed_dtype(*t)) return *name;
    s.fail(key, "unknown dtype " + t->dump() + " (allowed: " + spellings + ")" +
                    (checked ? "; DeepSpeed 0.19.8 refuses it too"
                             : "; DeepSpeed 0.19.8 would not read it in " + model +
                                   " training, dtrain refuses it so that a typo cannot go "
                                   "unnoticed"));
  };
  if (const std::string p = dtype("param_dtype", true); !p.empty() && p != model)
    s.fail("param_dtype", "\"" + p + "\" conflicts with the enabled precision mode (the model " +
                              "trains in " + model +
                              "; DeepSpeed 0.19.8 refuses it too): set the matching fp16/bf16 "
                              "\"enabled\" flag or remove param_dtype");
  d.buffer_dtype = dtype("buffer_dtype", mixed);
  if (d.buffer_dtype == "int8" && mixed)
    s.fail("buffer_dtype",
           "int8 buffers are not supported by dtrain (DeepSpeed 0.19.8 would truncate every "
           "floating buffer to int8); give fp16, bf16 or fp32");
  if (!d.buffer_dtype.empty() && !mixed) {
    s.note("buffer_dtype",
           "ignored in fp32 training (DeepSpeed 0.19.8 casts buffers only under fp16 or bf16)");
    d.buffer_dtype.clear();
  }
  if (s.has("keep_in_fp32_modules")) {
    const json* k = s.get("keep_in_fp32_modules");
    const bool is_auto = k && k->is_string() && k->get<std::string>() == "auto";
    bool list = k && k->is_array();
    for (size_t i = 0; list && i < k->size(); ++i) list = (*k)[i].is_string();
    if (!is_auto && !list)
      s.fail("keep_in_fp32_modules", "must be \"auto\" or a list of name patterns, got " +
                                         (k ? k->dump() : std::string("null")) +
                                         " (DeepSpeed 0.19.8 refuses it too)");
    if (is_auto) {
      if (mixed)
        s.note("keep_in_fp32_modules",
               "\"auto\": no buffer kept in fp32 (DeepSpeed takes the patterns from a Hugging "
               "Face model's _keep_in_fp32_modules lists; a C++ module has none: list them)");
    } else if (mixed) {
      for (const auto& pattern : *k) {
        d.keep_in_fp32_modules.push_back(pattern.get<std::string>());
        try {
          std::regex(keep_in_fp32_regex({d.keep_in_fp32_modules.back()}));
        } catch (const std::regex_error&) {
          s.fail("keep_in_fp32_modules", pattern.dump() +
                                             " is not a regular expression ('*' stands for any "
                                             "characters; DeepSpeed 0.19.8 refuses it too)");
        }
      }
    }
  }
  const std::string gad = dtype("grad_accum_dtype", true);
  d.grad_accum_dtype = gad == model ? "" : gad;
  if (!gad.empty() && gad != model) {
    const std::string mix = "model dtype " + model + " with grad_accum_dtype " + gad;
    if (c.zero.stage == 0)
      s.fail("grad_accum_dtype",
             mix +
                 " at stage 0 is not supported by dtrain (DeepSpeed 0.19.8's engine refuses "
                 "it too when it builds the optimizer: \"unsupported mix\"); remove it or "
                 "enable ZeRO");
    if (gad != "fp32")
      s.fail("grad_accum_dtype", mix +
                                     " is not supported by dtrain: it accumulates in fp32 "
                                     "or in the model's dtype");
    if (c.zero.stage == 1 && model == "bf16" && !c.zero.offload_optimizer.enabled() &&
        !c.zero.compute_grad_norm)
      s.fail("grad_accum_dtype",
             "fp32 with bf16 at stage 1 needs the gradient norm: remove "
             "zero_optimization.compute_grad_norm false (DeepSpeed 0.19.8 refuses the pair "
             "too)");
  }
  s.finish();
}

// "torch_autocast": DeepSpeed 0.19.8 reads it with .get() (runtime/config.py) whether or not it
// is enabled: a dtype its DtypeEnum does not know and modules that are not a list of strings
// are refused; the engine then runs its forward under torch.autocast (torch_autocast.py,
// autocast_if_enabled); at stages 1-3 it reduces the marked modules' gradients in the autocast
// dtype (at stage 3 it all-gathers their parameters so too, which changes nothing their
// autocast ops compute). With fp16 it scales the loss with torch.amp.GradScaler (the engine's
// AmpGradScaler); fp16 over 16-bit parameters is refused.
void parse_torch_autocast(Section& root, Config& c) {
  if (!root.has("torch_autocast")) return;
  const json* v = root.get("torch_autocast");
  if (!v || !v->is_object())
    root.fail("torch_autocast", std::string(v ? "a " + std::string(v->type_name()) : "null") +
                                    " (DeepSpeed 0.19.8 fails on it too): give an object, e.g. "
                                    "{\"enabled\": true, \"dtype\": \"bfloat16\"}");
  Section s(*v, "torch_autocast", root.notes());
  s.ignores_unknown_keys_like(root);
  auto& a = c.torch_autocast;
  s.boolean("enabled", a.enabled);
  if (const json* d = s.get("dtype")) {
    const auto name = deepspeed_dtype(*d);
    if (!name)
      s.fail("dtype", "unknown dtype " + d->dump() +
                          " (allowed: bf16/bfloat16, fp16/float16/half, with or without a torch. "
                          "prefix; DeepSpeed 0.19.8 refuses it too)");
    a.dtype = *name;
  }
  if (s.has("lower_precision_safe_modules")) {
    // DeepSpeed checks the type when it reads the config, and imports each "package.Class"
    // when the engine starts with autocast enabled (a string is iterated, character by
    // character, and fails there).
    const json* m = s.get("lower_precision_safe_modules");
    bool strings = m && (m->is_array() || m->is_string());
    for (size_t i = 0; strings && m->is_array() && i < m->size(); ++i)
      strings = (*m)[i].is_string();
    if (!strings)
      s.fail("lower_precision_safe_modules",
             "must be a list of module class names (\"torch.nn.Linear\"), got " +
                 (m ? m->dump() : std::string("null")) + " (DeepSpeed 0.19.8 refuses it too)");
    if (a.enabled && m->is_string())
      s.fail("lower_precision_safe_modules",
             "a string, not a list: DeepSpeed 0.19.8 takes each of its characters as a module "
             "name and fails when the engine starts; give a list, e.g. [" +
                 m->dump() + "]");
    for (size_t i = 0; m->is_array() && i < m->size(); ++i) {
      const std::string name = (*m)[i].get<std::string>();
      if (a.enabled && name.find('.') == std::string::npos)
        s.fail("lower_precision_safe_modules",
               "\"" + name +
                   "\" has no package (DeepSpeed 0.19.8 fails to import it when the engine "
                   "starts); give the class with its package, e.g. \"torch.nn.Linear\"");
      a.lower_precision_safe_modules.push_back(name);
    }
  }
  s.finish();
  if (!a.enabled) return;
  if (a.dtype == "int8")
    s.fail("dtype",
           "int8: torch.autocast turns itself off for it, and DeepSpeed 0.19.8 would reduce the "
           "lower_precision_safe_modules' gradients in int8 at stages 1-3; give bf16");
  if (a.dtype == "fp32")
    s.note("dtype",
           "\"fp32\": torch.autocast takes bf16 and fp16 only, and turns itself off for it "
           "(with a warning): the forward runs in the parameters' dtype, in DeepSpeed and in "
           "dtrain");
  if (a.dtype == "fp16" && (c.fp16.enabled || c.bf16))
    s.fail("dtype",
           std::string("fp16 torch_autocast with the ") + (c.fp16.enabled ? "fp16" : "bf16") +
               " section enabled is not supported by dtrain: DeepSpeed 0.19.8's GradScaler "
               "for it steps fp32 parameters (over bf16 ones it fails: \"No inf checks were "
               "recorded for this optimizer\"; over fp16 ones its loss scaler unscales the "
               "gradients a second time); keep the parameters fp32 (disable that section) "
               "under fp16 torch_autocast, or use that section without torch_autocast");
  if (c.zero.stage == 0 && !a.lower_precision_safe_modules.empty())
    s.note("lower_precision_safe_modules",
           "read by DeepSpeed 0.19.8 at stages 1-3 only (the dtype it reduces those modules' "
           "gradients in); at stage 0 it changes nothing");
  if (c.zero.stage > 0 && root.has("communication_data_type"))
    root.note("communication_data_type",
              "not read under torch_autocast at stages 1-3: DeepSpeed 0.19.8 then reduces each "
              "parameter's gradient in its own dtype (the autocast dtype for the "
              "lower_precision_safe_modules' parameters, the parameter's dtype for the rest), "
              "and so does dtrain");
}

// DeepSpeed 0.19.8's get_communication_data_type: "fp32", "fp16" or "bf16" in any case; null is
// its default (the model's dtype); anything else it refuses. The engine reads it from the raw
// config (communication_data_type()).
void parse_communication_data_type(Section& root, const Config& c) {
  const json* v = root.get("communication_data_type");
  if (!v) return;
  const std::string name = v->is_string() ? communication_data_type(c) : "";
  if (name != "fp32" && name != "fp16" && name != "bf16")
    root.fail("communication_data_type",
              v->dump() +
                  " is not a communication dtype (allowed: \"fp16\", \"bf16\", \"fp32\"; "
                  "DeepSpeed 0.19.8 refuses it too); remove it to reduce in the model's dtype");
}

// What DeepSpeed 0.19.8 decides only when its engine builds the optimizer (deepspeed.initialize),
// from keys of several sections.
void check_engine_rules(Section& root, Config& c) {
  const json& raw = c.raw;
  const json* zero = raw.contains("zero_optimization") && raw["zero_optimization"].is_object()
                         ? &raw["zero_optimization"]
                         : nullptr;
  const bool offload = c.zero.offload_optimizer.enabled();
  if (zero && !c.zero.compute_grad_norm) {
    Section zs(*zero, "zero_optimization", nullptr, true);
    if (c.gradient_clipping > 0)
      zs.fail("compute_grad_norm",
              "false needs \"gradient_clipping\": 0 (DeepSpeed 0.19.8 refuses it with clipping, "
              "whose default is 1.0); gradient_clipping is " +
                  json(c.gradient_clipping).dump());
    if (offload)
      zs.fail("compute_grad_norm",
              "false does not go with offload_optimizer (DeepSpeed 0.19.8 refuses the pair too); "
              "remove one of them");
  }
  const json* params = raw.contains("optimizer") && raw["optimizer"].is_object() &&
                               raw["optimizer"].contains("params") &&
                               raw["optimizer"]["params"].is_object()
                           ? &raw["optimizer"]["params"]
                           : nullptr;
  const bool torch_adam = params && params->value("torch_adam", json(false)) == json(true);
  if (params && params->contains("set_grad_none") && offload && !torch_adam)
    throw ConfigError(
        "optimizer.params.set_grad_none: unknown key with offload_optimizer (DeepSpeed 0.19.8 "
        "refuses it too: it passes the key to its CPU Adam, which has no such argument); remove "
        "it");
  // Adagrad: DeepSpeed 0.19.8 builds DeepSpeedCPUAdagrad(lr, eps, weight_decay, amsgrad,
  // fp32_optimizer_states) with offload_optimizer, else torch.optim.Adagrad(lr, lr_decay,
  // weight_decay, initial_accumulator_value, eps, foreach, maximize, differentiable, fused).
  if (params && c.optimizer.type == "Adagrad") {
    static const std::vector<std::string> torch_only = {
        "lr_decay", "initial_accumulator_value", "foreach", "maximize", "differentiable", "fused"};
    static const std::vector<std::string> cpu_only = {"amsgrad", "fp32_optimizer_states"};
    for (const auto& k : offload ? torch_only : cpu_only)
      if (params->contains(k))
        throw ConfigError(
            "optimizer.params." + k +
            (offload ? ": unknown key with offload_optimizer (DeepSpeed 0.19.8 refuses it too: it "
                       "passes the key to its CPU Adagrad, DeepSpeedCPUAdagrad, which takes only "
                       "lr, eps, weight_decay, amsgrad and fp32_optimizer_states); remove it, or "
                       "drop offload_optimizer for torch.optim.Adagrad's"
                     : ": unknown key without offload_optimizer (DeepSpeed 0.19.8 refuses it too: "
                       "it passes the key to torch.optim.Adagrad, which has no such argument; "
                       "only its CPU Adagrad, with offload_optimizer, takes it); remove it"));
  }
  // Lion: DeepSpeed 0.19.8 builds DeepSpeedCPULion(lr, betas, weight_decay,
  // fp32_optimizer_states) with offload_optimizer, else FusedLion(lr, betas, weight_decay,
  // set_grad_none), a CUDA kernel whose update dtrain runs as tensor ops (on any device).
  if (params && c.optimizer.type == "Lion") {
    const std::string k = offload ? "set_grad_none" : "fp32_optimizer_states";
    if (params->contains(k))
      throw ConfigError(
          "optimizer.params." + k +
          (offload ? ": unknown key with offload_optimizer (DeepSpeed 0.19.8 refuses it too: it "
                     "passes the key to its CPU Lion, DeepSpeedCPULion, which takes only lr, "
                     "betas, weight_decay and fp32_optimizer_states); remove it"
                   : ": unknown key without offload_optimizer (DeepSpeed 0.19.8 refuses it too: "
                     "it passes the key to FusedLion, which takes only lr, betas, weight_decay "
                     "and set_grad_none); remove it"));
  }
  // Adagrad at stage 0 under fp16/bf16: DeepSpeed 0.19.8 wraps torch.optim.Adagrad in its
  // FP16_UnfusedOptimizer, whose fp32 copies of the parameters lack the state Adagrad made in its
  // constructor: its first step (on zero gradients, in deepspeed.initialize) fails. (With
  // offload_optimizer its DeepSpeedCPUAdagrad makes its state at its first step: that runs.)
  if (c.optimizer.type == "Adagrad" && c.zero.stage == 0 && (c.fp16.enabled || c.bf16) && !offload)
    throw ConfigError(
        "optimizer.type: Adagrad at stage 0 with " + std::string(c.bf16 ? "bf16" : "fp16") +
        " fails in DeepSpeed 0.19.8 too (its FP16_UnfusedOptimizer steps fp32 copies of the "
        "parameters for which torch.optim.Adagrad made no state: KeyError: 'sum' in "
        "deepspeed.initialize); use ZeRO stage 1, 2 or 3, or fp32");
  // DeepSpeed's engine runs ZeRO only with optimizers it has tested (Adam, AdamW, Adagrad, Lion
  // and their CPU versions) unless told otherwise; dtrain runs SGD and Lamb partitioned too.
  bool untested_ok = false;
  if (auto u = raw.find("zero_allow_untested_optimizer"); u != raw.end() && u->is_boolean())
    untested_ok = u->get<bool>();
  if (c.optimizer.given && c.zero.stage > 0 && !untested_ok &&
      (c.optimizer.type == "SGD" || c.optimizer.type == "Lamb"))
    root.note("optimizer", c.optimizer.type +
                               " under ZeRO: dtrain runs it; DeepSpeed 0.19.8 would refuse it "
                               "(an untested ZeRO optimizer) without "
                               "\"zero_allow_untested_optimizer\": true");
}

// "steps_per_print" and "log_level" as DeepSpeed 0.19.8 uses them. DeepSpeedConfig takes any
// steps_per_print (a plain .get()); its engine computes `(global_steps + 1) % steps_per_print`
// after every optimizer step on rank 0, so 0 or false (ZeroDivisionError) and a string, list or
// object (TypeError) stop its first step: refused here before the run. Its logger prints the
// line only at log level info or below; deepspeed.initialize sets the level from "log_level",
// lowercased, and refuses anything else.
void parse_progress(Section& root, Config& c) {
  if (const json* v = root.get("steps_per_print")) {
    if (v->is_boolean() ? !v->get<bool>() : v->is_number() && v->get<double>() == 0)
      root.fail("steps_per_print",
                v->dump() +
                    " fails DeepSpeed 0.19.8's first optimizer step (ZeroDivisionError: it takes "
                    "the step count modulo this value; DeepSpeedConfig itself accepts it): give a "
                    "positive integer, or leave the key out for no progress line");
    if (!v->is_number() && !v->is_boolean())
      root.fail("steps_per_print",
                "expected a number, got " + v->dump() +
                    " (DeepSpeed 0.19.8 accepts it in DeepSpeedConfig but fails its first "
                    "optimizer step with a TypeError): give a positive integer");
    c.steps_per_print = v->is_boolean() ? 1.0 : v->get<double>();
    if (v->is_boolean())
      root.note("steps_per_print", "true: every step (Python's True is 1, as DeepSpeed reads it)");
  }
  if (const json* v = root.get("log_level")) {
    std::string level = v->is_string() ? lower(v->get<std::string>()) : "";
    if (level != "debug" && level != "info" && level != "warning" && level != "error" &&
        level != "critical")
      root.fail("log_level", v->dump() +
                                 " is not a log level (allowed: debug, info, warning, error, "
                                 "critical, in any case; DeepSpeed 0.19.8 refuses it too when "
                                 "deepspeed.initialize sets it)");
    c.log_level = level;
  }
  if (c.steps_per_print && c.log_level != "info" && c.log_level != "debug")
    root.note("steps_per_print",
              "no progress line at log_level " +
                  (c.log_level.empty() ? std::string("warning (the default)") : c.log_level) +
                  ": DeepSpeed 0.19.8's logger hides it there, and so does dtrain; set "
                  "\"log_level\": \"info\" to see it");
}

// "timers": DeepSpeed 0.19.8 reads only "throughput" (get_timers_config), through pydantic
// (DeepSpeedThroughputTimerConfig: enabled, synchronized; unknown keys refused).
void parse_timers(Section& root, Config& c) {
  const json* v = root.get("timers");
  if (!v) {
    if (root.has("timers"))
      root.fail("timers",
                "null (DeepSpeed 0.19.8 fails on it too): give an object, e.g. {\"throughput\": "
                "{\"enabled\": false}}, or leave the key out");
    return;
  }
  Section timers(*v, "timers", root.notes());
  timers.ignores_unknown_keys_like(root);
  if (const json* t = timers.get("throughput")) {
    Section s(*t, "timers.throughput", root.notes(), /*validated=*/true);
    s.boolean("enabled", c.throughput_timer);
    s.boolean("synchronized", c.throughput_timer_synchronized);
    s.finish();
  } else if (timers.has("throughput")) {
    timers.fail("throughput",
                "null (DeepSpeed 0.19.8 fails on it too): give an object or leave the key out");
  }
  timers.finish();
}

void set_batch(Config& c, std::optional<int64_t> tbs, std::optional<int64_t> micro,
               std::optional<int64_t> gas) {
  const int64_t ws = c.world_size;
  auto mismatch = [&](const std::string& what) { throw ConfigError("train_batch_size: " + what); };
  // Every product below, checked once: the batch keys are int64 and a product that does not
  // fit is no batch anyone trains with.
  {
    int64_t p = ws, q = 0;
    for (const auto& v : {micro, gas})
      if (v && __builtin_mul_overflow(p, *v, &q))
        throw ConfigError(
            "train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
            "world_size: too large for a batch size (" +
            std::to_string(micro.value_or(1)) + " * " + std::to_string(gas.value_or(1)) + " * " +
            std::to_string(ws) + "); check the values");
      else if (v)
        p = q;
  }
  if (tbs && micro && gas) {
    if (*tbs != *micro * *gas * ws)
      mismatch(
          "is not equal to train_micro_batch_size_per_gpu * gradient_accumulation_steps * "
          "world_size: " +
          std::to_string(*tbs) + " != " + std::to_string(*micro) + " * " + std::to_string(*gas) +
          " * " + std::to_string(ws) + " (change one of them, or leave one out to derive it)");
  } else if (tbs && micro) {
    if (*tbs % (*micro * ws) != 0)
      mismatch(std::to_string(*tbs) +
               " is not divisible by train_micro_batch_size_per_gpu * world_size = " +
               std::to_string(*micro * ws));
    gas = *tbs / (*micro * ws);
  } else if (tbs && gas) {
    if (*tbs % (*gas * ws) != 0)
      mismatch(std::to_string(*tbs) +
               " is not divisible by gradient_accumulation_steps * world_size = " +
               std::to_string(*gas * ws));
    micro = *tbs / (*gas * ws);
  } else if (micro && gas) {
    tbs = *micro * *gas * ws;
  } else if (tbs) {
    gas = 1;
    if (*tbs % ws != 0)
      mismatch(std::to_string(*tbs) + " is not divisible by the world size " + std::to_string(ws));
    micro = *tbs / ws;
  } else if (micro) {
    gas = 1;
    tbs = *micro * ws;
  } else {
    throw ConfigError(
        "train_batch_size: either train_batch_size or train_micro_batch_size_per_gpu needs to be "
        "provided");
  }
  if (*micro <= 0)
    mismatch(
        "the derived train_micro_batch_size_per_gpu is 0 (train_batch_size too small for the world "
        "size)");
  c.train_batch_size = *tbs;
  c.train_micro_batch_size_per_gpu = *micro;
  c.gradient_accumulation_steps = *gas;
}

}  // namespace

std::string closest_key(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  // Close enough to be a typo: within a third of the longer word (at least 2 edits).
  size_t limit = std::max<size_t>(2, std::max(word.size(), best.size()) / 3);
  return best_d <= limit ? best : std::string();
}

Config parse_config(const json& config, int world_size, const ParseOptions& options) {
  if (world_size < 1)
    throw ConfigError("world size must be >= 1, got " + std::to_string(world_size));
  Config c;
  c.world_size = world_size;
  c.raw = config;
  Section root(config, "", &c.notes);
  root.ignores_unknown_keys(options.strict);
  // Removed in DeepSpeed 0.19.8 (runtime/config.py refuses them): DeepSpeed's reasons.
  static const std::vector<std::pair<std::string, std::string>> removed = {
      {"nebula", "Nebula checkpointing was removed from DeepSpeed"},
      {"compression_training", "DeepSpeed's compression library was removed"},
      {"amp", "NVIDIA Apex AMP integration was removed; use \"fp16\" or \"bf16\""},
      {"quantize_training", "Mixture-of-Quantization (MoQ) was removed"},
      {"sparse_gradients", "sparse compression of dense embedding gradients was removed"},
      {"eigenvalue", "eigenvalue-based MoQ was removed"},
      {"sparse_attention", "DeepSpeed Sparse Attention was removed"},
      {"elasticity",
       "elastic training's batch configuration was removed; set train_batch_size / "
       "train_micro_batch_size_per_gpu / gradient_accumulation_steps directly (dtrain's elastic "
       "launch is `dtrain run --nnodes MIN:MAX`)"},
      {"graph_harvesting", "graph harvesting was removed"},
      {"curriculum_learning",
       "the top-level curriculum_learning was removed (DeepSpeed now reads "
       "data_efficiency.data_sampling.curriculum_learning)"},
      {"progressive_layer_drop", "Progressive Layer Dropping was removed"}};
  for (const auto& [key, why] : removed)
    if (root.has(key))
      root.fail(key, why + " in DeepSpeed 0.19.8, which refuses this key too; remove it");
  std::optional<int64_t> tbs, micro, gas;
  int64_t v = 0;
  if (root.integer("train_batch_size", v, 1, INT64_MAX, true)) tbs = v;
  if (root.integer("train_micro_batch_size_per_gpu", v, 1, INT64_MAX, true)) micro = v;
  if (root.integer("gradient_accumulation_steps", v, 1, INT64_MAX, true)) gas = v;
  parse_optimizer(root, c);
  parse_scheduler(root, c);
  std::string master_16bit;  // the 16-bit master weights option set, if any (needs ZeRO)
  if (auto f = root.get("fp16")) {
    Section s(*f, "fp16", &c.notes, true);
    s.boolean("enabled", c.fp16.enabled);
    // As DeepSpeed's DeepSpeedFP16Config: loss_scale a finite number >= 0 (not a boolean);
    // loss_scale_window and min_loss_scale integers, > 0 where the scaling is dynamic (checked
    // below); initial_scale_power and hysteresis any integer.
    s.number("loss_scale", c.fp16.loss_scale, 0, INFINITY, false, /*allow_bool=*/false);
    if (std::isinf(c.fp16.loss_scale))
      s.fail("loss_scale", "must be a finite number (DeepSpeed 0.19.8 refuses inf too)");
    s.integer("initial_scale_power", c.fp16.initial_scale_power, INT32_MIN, INT32_MAX);
    s.integer("loss_scale_window", c.fp16.loss_scale_window, INT64_MIN, INT64_MAX, false,
              /*allow_bool=*/false);
    s.integer("hysteresis", c.fp16.hysteresis, INT32_MIN, INT32_MAX);
    s.boolean("consecutive_hysteresis", c.fp16.consecutive_hysteresis);
    int64_t min_scale = 1;
    if (s.integer("min_loss_scale", min_scale, INT64_MIN, INT64_MAX, false, /*allow_bool=*/false))
      c.fp16.min_loss_scale = static_cast<double>(min_scale);
    if (c.fp16.enabled && c.fp16.loss_scale == 0) {
      if (c.fp16.loss_scale_window <= 0)
        s.fail("loss_scale_window", "must be > 0 with dynamic loss scaling (loss_scale 0), got " +
                                        std::to_string(c.fp16.loss_scale_window) +
                                        " (DeepSpeed 0.19.8 refuses it too)");
      if (c.fp16.min_loss_scale <= 0)
        s.fail("min_loss_scale", "must be > 0 with dynamic loss scaling (loss_scale 0), got " +
                                     std::to_string(min_scale) +
                                     " (DeepSpeed 0.19.8 refuses it too)");
      if (c.fp16.hysteresis < 1)
        s.note("hysteresis", std::to_string(c.fp16.hysteresis) +
                                 ": an overflow never lowers the loss scale (it only skips the "
                                 "step), as in DeepSpeed 0.19.8");
    }
    s.ignore("auto_cast",
             "DeepSpeed casts the module's inputs to fp16; dtrain does not (cast "
             "your inputs)");
    bool fp16_master = false;
    s.boolean("fp16_master_weights_and_grads", fp16_master);
    if (fp16_master)
      s.note("fp16_master_weights_and_grads",
             "DeepSpeed keeps fp16 master weights; dtrain keeps fp32 masters");
    if (fp16_master) master_16bit = "fp16.fp16_master_weights_and_grads";
    s.finish();
  } else if (root.has("fp16")) {
    root.fail("fp16", "null (DeepSpeed 0.19.8 fails on it too): give an object or leave it out");
  }
  // DeepSpeed reads "bf16", and its old name "bfloat16" only where "bf16" is absent (or null).
  const json* bf16 = root.get("bf16");
  const json* bfloat16 = root.get("bfloat16");
  if (bf16 && bfloat16)
    root.note("bfloat16",
              "ignored: bf16 is given, and DeepSpeed 0.19.8 reads this old name only without it");
  if (!bf16 && !bfloat16 && root.has("bfloat16"))
    root.fail("bfloat16",
              "null (DeepSpeed 0.19.8 fails on it too): give an object or leave it out");
  if (const json* b = bf16 ? bf16 : bfloat16) {
    Section s(*b, bf16 ? "bf16" : "bfloat16", &c.notes, true);
    s.boolean("enabled", c.bf16);
    for (const char* k : {"immediate_grad_update", "check_grad_overflow"}) s.accept_bool(k);
    bool master = false, states = false;
    s.boolean("bf16_master_weights_and_grads", master);
    s.boolean("bf16_optimizer_states", states);
    if (master)
      s.note("bf16_master_weights_and_grads",
             "DeepSpeed keeps bf16 master weights; dtrain keeps fp32 masters");
    if (states) {
      if (!master)
        s.fail("bf16_optimizer_states",
               "needs bf16_master_weights_and_grads: true (DeepSpeed 0.19.8 refuses it too)");
      s.note("bf16_optimizer_states",
             "DeepSpeed keeps the optimizer state in bf16; dtrain keeps it in fp32");
    }
    if (master || states)
      master_16bit = s.where(master ? "bf16_master_weights_and_grads" : "bf16_optimizer_states");
    s.finish();
  }
  if (c.fp16.enabled && c.bf16) throw ConfigError("fp16, bf16: both enabled; choose one");
  if (Section::is_auto(root.get("gradient_clipping"))) {
    root.note("gradient_clipping",
              "\"auto\": 1.0 (DeepSpeed's default; Hugging Face's Trainer would fill in its "
              "max_grad_norm, 1.0 unless set)");
  } else {
    root.number("gradient_clipping", c.gradient_clipping);
    if (c.gradient_clipping < 0)
      root.note("gradient_clipping", json(c.gradient_clipping).dump() +
                                         ": no clipping (DeepSpeed 0.19.8 clips only above 0)");
  }
  std::vector<std::string> unused;  // keys given that dtrain does not act on
  parse_zero(root, c, unused);
  parse_data_types(root, c);
  parse_communication_data_type(root, c);
  parse_torch_autocast(root, c);
  // DeepSpeed 0.19.8 keeps 16-bit masters only with ZeRO (DeepSpeedConfig refuses them at
  // stage 0).
  if (!master_16bit.empty() && c.zero.stage == 0)
    throw ConfigError(master_16bit +
                      ": needs zero_optimization.stage 1, 2 or 3 (DeepSpeed 0.19.8 refuses it at "
                      "stage 0 too); remove it or enable ZeRO");
  check_engine_rules(root, c);
  parse_progress(root, c);
  parse_timers(root, c);
  check_by_name_rules(root, c);
  root.boolean("wall_clock_breakdown", c.wall_clock_breakdown);
  root.boolean("prescale_gradients", c.prescale_gradients);
  root.number("gradient_predivide_factor", c.gradient_predivide_factor, 1e-30);
  root.boolean("managed_gradient_accumulation", c.managed_gradient_accumulation);
  if (!c.managed_gradient_accumulation && c.zero.overlap_comm && c.zero.stage < 2)
    root.fail("managed_gradient_accumulation",
              "false does not go with zero_optimization.overlap_comm at stage " +
                  std::to_string(c.zero.stage) +
                  " (DeepSpeed 0.19.8 refuses the pair too: it reduces a caller-owned "
                  "accumulation at step(), overlapping nothing); set overlap_comm false or use "
                  "stage 2 or 3");
  // DeepSpeed 0.19.8 scales reductions' inputs and outputs by these; dtrain divides by the world
  // size once: before reducing at stages 1-3 (its ZeRO optimizers' default), after at stage 0.
  if (c.prescale_gradients)
    root.note("prescale_gradients",
              "true: DeepSpeed divides by the world size before reducing; dtrain does so at "
              "stages 1-3 and after the reduction at stage 0 (the same mean, rounded at another "
              "point)");
  if (c.gradient_predivide_factor != 1.0)
    root.note("gradient_predivide_factor",
              json(c.gradient_predivide_factor).dump() +
                  ": DeepSpeed divides by it before reducing and by world size / it after; "
                  "dtrain divides by the world size once, before reducing at stages 1-3 and "
                  "after at stage 0 (the same mean, rounded at another point)");
  // DeepSpeed reads these; they change nothing in what dtrain computes or prints. Given, they
  // are named in one note (below).
  root.accept("zero_allow_untested_optimizer");  // acted on: silences the untested-ZeRO note
  for (const char* k :
       {"memory_breakdown", "dump_state", "disable_allgather", "disable_python_gc",
        "zero_force_ds_cpu_optimizer", "dataloader_drop_last", "gradient_allreduce_op",
        "use_data_before_expert_parallelism", "vocabulary_size"})
    if (root.get(k)) unused.push_back(k);
  if (root.has("wall_clock_breakdown")) unused.push_back("wall_clock_breakdown");
  // Sections DeepSpeed acts on and dtrain does not: accepted with what dtrain does instead.
  static const std::vector<std::pair<std::string, std::string>> ignored = {
      {"activation_checkpointing",
       "DeepSpeed's activation checkpointing (deepspeed.checkpointing); dtrain keeps every "
       "activation (checkpoint inside your module to trade compute for memory)"},
      {"seq_parallel_communication_data_type", "dtrain has no sequence parallelism"},
      {"tensorboard", "DeepSpeed's TensorBoard monitor; dtrain logs through dtrain::mlflow"},
      {"wandb", "DeepSpeed's W&B monitor; dtrain logs through dtrain::mlflow"},
      {"csv_monitor", "DeepSpeed's CSV monitor; dtrain logs through dtrain::mlflow"},
      {"comet", "DeepSpeed's Comet monitor; dtrain logs through dtrain::mlflow"},
      {"comms_logger",
       "DeepSpeed's communication logger; dtrain's is the timeline "
       "(DTRAIN_TIMELINE) and flight recorder"},
      {"flops_profiler", "DeepSpeed's FLOPS profiler; not in dtrain"},
      {"autotuning", "DeepSpeed's autotuner; not in dtrain (dtrain::tune searches configs)"},
      {"aio", "libaio settings for NVMe offload, which dtrain does not do"},
      {"checkpoint",
       "DeepSpeed's checkpoint engine settings; dtrain writes every checkpoint "
       "atomically in DeepSpeed's layout, and always refuses ranks that save under different "
       "tags (tag_validation Fail)"},
      {"data_efficiency", "DeepSpeed's data sampling/routing; give dtrain the data in order"},
      {"compile", "DeepSpeed's torch.compile; not in libtorch's C++ frontend"},
      {"hybrid_engine", "DeepSpeed-Chat's inference engine; not in dtrain"},
      {"pipeline",
       "DeepSpeed's pipeline engine settings; dtrain's pipeline is "
       "dtrain::pipeline"},
      {"tensor_parallel",
       "DeepSpeed's AutoTP; dtrain's tensor parallelism is "
       "dtrain::tensor_parallel"},
      {"expert_parallel", "DeepSpeed's mixture-of-experts parallelism; not in dtrain"},
      {"weight_quantization", "DeepSpeed's inference weight quantization; not in dtrain"},
      {"datastates_ckpt",
       "DataStates asynchronous checkpointing; dtrain checkpoints "
       "synchronously"},
      {"sequence_parallel_size", "dtrain has no sequence parallelism"}};
  for (const auto& [key, why] : ignored) root.ignore(key, "accepted, not acted on: " + why);
  root.finish();
  if (!unused.empty()) {
    std::string keys;
    for (const auto& k : unused) keys += (keys.empty() ? "" : ", ") + k;
    c.notes.push_back(
        keys +
        ": read and type-checked as DeepSpeed 0.19.8 reads them, but not acted on by dtrain "
        "(they tune DeepSpeed's own timers, logging, memory reports or implementation; what dtrain "
        "computes is the same without them: remove them, or keep them for DeepSpeed)");
  }
  set_batch(c, tbs, micro, gas);
  return c;
}

Config parse_config_text(const std::string& text_or_path, int world_size,
                         const ParseOptions& options) {
  std::string text = text_or_path;
  auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') {
    std::error_code ec;
    if (std::filesystem::is_directory(text_or_path, ec))
      throw ConfigError(text_or_path +
                        ": is a directory (give a path to a JSON file or the JSON text)");
    std::ifstream in(text_or_path, std::ios::binary);
    if (!in)
      throw ConfigError(
          text_or_path +
          ": cannot read the config file (give a path to a JSON file or the JSON text)");
    // Up to a bound (a device such as /dev/zero must not be read forever); a pipe is fine.
    constexpr size_t kMaxBytes = size_t(16) << 20;
    text.clear();
    char chunk[1 << 16];
    while (in.read(chunk, sizeof chunk) || in.gcount() > 0) {
      text.append(chunk, static_cast<size_t>(in.gcount()));
      if (text.size() > kMaxBytes)
        throw ConfigError(text_or_path +
                          ": larger than 16 MiB, which no DeepSpeed config is (give a path to a "
                          "JSON file or the JSON text)");
    }
  }
  return parse_config(
      read_config_text(text, first == std::string::npos || text_or_path[first] != '{'
                                 ? text_or_path
                                 : std::string("config")),
      world_size, options);
}

}  // namespace dtrain::zero
