// A DeepSpeed config's precision sections: data_types, torch_autocast and
// communication_data_type (config_sections.h), and what the engine asks of them
// (zero/data_types.h, zero/overflow_rules.h).
#include <algorithm>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "zero/data_types.h"
#include "zero/overflow_rules.h"

#include "zero/config_sections.h"

namespace dtrain::zero {

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
    config_parse::Section(*it, section, &scratch, true).boolean("check_grad_overflow", check);
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

}  // namespace dtrain::zero

namespace dtrain::zero::config_parse {
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

}  // namespace

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

}  // namespace dtrain::zero::config_parse
