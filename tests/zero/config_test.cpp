// DeepSpeed's config: batch-size rules, strictness (unknown keys with the closest valid one,
// types, ranges) and `dtrain zero check`.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "core/python_repr.h"
#include "dtrain/zero_config.h"
#include "launcher/subprocess.h"
#include "support/paths.h"

namespace {

using dtrain::zero::Config;
using dtrain::zero::ConfigError;
using dtrain::zero::parse_config;
using nlohmann::json;
using namespace std::chrono_literals;

std::string error_of(const json& j, int world = 4) {
  try {
    parse_config(j, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string notes(const Config& c) {
  std::string all;
  for (const auto& n : c.notes) all += n + "\n";
  return all;
}

TEST(ZeroConfig, BatchSizesFollowDeepSpeedsDerivationRules) {
  auto c = parse_config({{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4}}, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  c = parse_config({{"train_batch_size", 32}, {"gradient_accumulation_steps", 4}}, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  c = parse_config({{"train_micro_batch_size_per_gpu", 3}, {"gradient_accumulation_steps", 5}}, 2);
  EXPECT_EQ(c.train_batch_size, 30);
  c = parse_config({{"train_batch_size", 16}}, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  c = parse_config({{"train_micro_batch_size_per_gpu", 8}}, 3);
  EXPECT_EQ(c.train_batch_size, 24);
  c = parse_config({{"train_batch_size", 24},
                    {"train_micro_batch_size_per_gpu", 2},
                    {"gradient_accumulation_steps", 3}},
                   4);
  EXPECT_EQ(c.train_batch_size, 24);
  // "auto" counts as not given: the other keys decide.
  c = parse_config({{"train_batch_size", "auto"},
                    {"train_micro_batch_size_per_gpu", 2},
                    {"gradient_accumulation_steps", "auto"}},
                   4);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
}

TEST(ZeroConfig, InconsistentBatchSizesAreNamed) {
  auto e = error_of({{"train_batch_size", 30},
                     {"train_micro_batch_size_per_gpu", 2},
                     {"gradient_accumulation_steps", 3}});
  EXPECT_NE(e.find("train_batch_size: is not equal to train_micro_batch_size_per_gpu * "
                   "gradient_accumulation_steps * world_size: 30 != 2 * 3 * 4"),
            std::string::npos)
      << e;
  e = error_of({{"train_batch_size", 30}, {"train_micro_batch_size_per_gpu", 4}});
  EXPECT_NE(e.find("not divisible by train_micro_batch_size_per_gpu * world_size = 16"),
            std::string::npos)
      << e;
  e = error_of(json::object());
  EXPECT_NE(
      e.find("either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"),
      std::string::npos)
      << e;
}

TEST(ZeroConfig, UnknownKeysInEverySectionNameThePathAndTheClosestKey) {
  json base = {{"train_batch_size", 8}};
  auto with = [&](const json& extra) {
    json j = base;
    j.update(extra);
    return error_of(j);
  };
  // Where DeepSpeed ignores unknown keys (the top level, optimizer, scheduler, data_types,
  // timers), a near-miss of a known key is a typo, refused with the key meant; where it passes
  // them to a constructor (optimizer and scheduler params) or validates the section (pydantic),
  // the message says that DeepSpeed refuses them too.
  const std::string typo =
      " (DeepSpeed 0.19.8 would silently ignore it; dtrain refuses it as a likely typo of a known "
      "key: correct it)";
  const std::string refused = " (DeepSpeed 0.19.8 refuses it too)";
  EXPECT_EQ(with({{"gradient_clipp1ng", 1.0}}),
            "gradient_clipp1ng: unknown key" + typo + "; did you mean gradient_clipping?");
  EXPECT_EQ(with({{"timers", {{"throughputs", {{"enabled", false}}}}}}),
            "timers.throughputs: unknown key" + typo + "; did you mean throughput?");
  EXPECT_EQ(with({{"data_types", {{"grad_acum_dtype", "fp32"}}}}),
            "data_types.grad_acum_dtype: unknown key" + typo + "; did you mean grad_accum_dtype?");
  EXPECT_EQ(with({{"zero_optimization", {{"stage3_prefetch_bucket_sise", 5}}}}),
            "zero_optimization.stage3_prefetch_bucket_sise: unknown key" + refused +
                "; did you mean stage3_prefetch_bucket_size?");
  EXPECT_EQ(with({{"zero_optimization", {{"offload_optimizer", {{"devise", "cpu"}}}}}}),
            "zero_optimization.offload_optimizer.devise: unknown key" + refused +
                "; did you mean device?");
  EXPECT_EQ(with({{"zero_optimization", {{"cuda_visible_devices", 0}}}}),
            "zero_optimization.cuda_visible_devices: unknown key" + refused);
  EXPECT_EQ(with({{"timers", {{"throughput", {{"wall", true}}}}}}),
            "timers.throughput.wall: unknown key" + refused);
  EXPECT_EQ(with({{"optimizer", {{"type", "Adam"}, {"params", {{"betas1", 0.9}}}}}}),
            "optimizer.params.betas1: unknown key (DeepSpeed 0.19.8 refuses it too: it passes the "
            "key to FusedAdam, which has no such argument); did you mean betas?");
  EXPECT_EQ(with({{"optimizer", {{"type", "SGD"}, {"params", {{"eps", 1e-8}}}}}}),
            "optimizer.params.eps: unknown key (DeepSpeed 0.19.8 refuses it too: it passes the "
            "key to torch.optim.SGD, which has no such argument)");
  EXPECT_EQ(with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_max_l", 0.1}}}}}}),
            "scheduler.params.warmup_max_l: unknown key (DeepSpeed 0.19.8 refuses it too: it "
            "passes the key to WarmupLR's constructor, which has no such argument); did you mean "
            "warmup_max_lr?");
  EXPECT_EQ(with({{"fp16", {{"enabled", true}, {"loss_scale_windw", 100}}}}),
            "fp16.loss_scale_windw: unknown key" + refused + "; did you mean loss_scale_window?");
}

// An unknown key far from every known one, where DeepSpeed 0.19.8 ignores it (real configs carry
// keys for their own scripts: DeepSpeedExamples' "cuda_visible_devices", "timers.wall"), is
// accepted with a note saying so - and refused under ParseOptions::strict, the message saying
// what strict mode does.
TEST(ZeroConfig, KeysDeepSpeedIgnoresAreAcceptedWithANoteUnlessStrict) {
  const json config = {{"train_batch_size", 8},
                       {"cuda_visible_devices", "0,1"},
                       {"completely_unrelated_thing", {{"a", 1}}},
                       {"optimizer", {{"type", "Adam"}, {"foo", 1}}},
                       {"scheduler", {{"type", "WarmupLR"}, {"params", json::object()}, {"x", 2}}},
                       {"data_types", {{"comment", "mine"}}},
                       {"timers", {{"wall", {{"enabled", true}}}}}};
  const auto c = parse_config(config, 4);
  EXPECT_EQ(c.train_batch_size, 8);
  EXPECT_EQ(c.optimizer.type, "Adam");
  const std::string ignored =
      ": unknown key, not read by DeepSpeed 0.19.8 (it ignores it) and ignored by dtrain too; "
      "`dtrain zero check --strict` (InitOptions::strict_config) refuses it";
  for (const char* path : {"cuda_visible_devices", "completely_unrelated_thing", "optimizer.foo",
                           "scheduler.x", "data_types.comment", "timers.wall"})
    EXPECT_NE(notes(c).find(path + ignored), std::string::npos) << path << "\n" << notes(c);
  const std::string strict =
      " (DeepSpeed 0.19.8 would silently ignore it; dtrain refuses it in strict mode so that a "
      "typo cannot go unnoticed: remove it or correct it)";
  auto strict_error = [](const json& j) -> std::string {
    try {
      parse_config(j, 4, {.strict = true});
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(strict_error({{"train_batch_size", 8}, {"cuda_visible_devices", "0,1"}}),
            "cuda_visible_devices: unknown key" + strict);
  EXPECT_EQ(strict_error({{"train_batch_size", 8}, {"optimizer", {{"type", "Adam"}, {"foo", 1}}}}),
            "optimizer.foo: unknown key" + strict);
  EXPECT_EQ(strict_error({{"train_batch_size", 8}, {"timers", {{"wall", true}}}}),
            "timers.wall: unknown key" + strict);
  EXPECT_EQ(strict_error({{"train_batch_size", 8}, {"data_types", {{"comment", "x"}}}}),
            "data_types.comment: unknown key" + strict);
  // Strict changes nothing else: a config without unknown keys parses the same.
  const json clean = {{"train_batch_size", 8}, {"optimizer", {{"type", "Adam"}}}};
  EXPECT_EQ(parse_config(clean, 4, {.strict = true}).notes, parse_config(clean, 4).notes);
}

// Text that is not JSON is named with where it breaks, without the JSON library's own tag.
TEST(ZeroConfig, TextThatIsNotJsonSaysWhereItBreaks) {
  try {
    dtrain::zero::parse_config_text("{\"train_batch_size\": 8,, }", 1);
    FAIL() << "accepted";
  } catch (const dtrain::zero::ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("config: not valid JSON: parse error at line 1, column ", 0), 0u) << what;
    EXPECT_EQ(what.find("json.exception"), std::string::npos) << what;
  }
}

// A config file or text is read as DeepSpeed reads one (hjson): comments, a comma before a
// closing bracket, integers written with a fraction or exponent; a JSON object (DeepSpeed's
// dict) is not, and there 1e3 is no integer. (The reference test compares such a file with
// DeepSpeed's own reading of it.)
TEST(ZeroConfig, TextIsReadAsDeepSpeedReadsAFile) {
  const std::string text = R"({
    # hjson's comment
    "train_micro_batch_size_per_gpu": 2.0,
    "optimizer": {"type": "Adam", "params": {"lr": 0.01,},},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 2e3, "note": "# not a comment, // nor this",}},
  })";
  EXPECT_THROW(dtrain::zero::parse_config_text(text, 1), dtrain::zero::ConfigError)
      << "the scheduler's unknown key 'note' must still be seen, inside the string's #";
  std::string good = text;
  good.erase(good.find(R"("note")"),
             std::string(R"("note": "# not a comment, // nor this",)").size());
  const auto c = dtrain::zero::parse_config_text(good, 1);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  EXPECT_EQ(c.scheduler.warmup_num_steps, 2000);
  json object = json::parse(R"({"train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1e3}}})");
  EXPECT_THROW(dtrain::zero::parse_config(object, 1), dtrain::zero::ConfigError);
  // Still refused: a comma with nothing before it (hjson refuses "[,]" and "{,}" too), and an
  // unquoted key.
  for (const char* bad : {R"({"train_batch_size": 8,, })", R"({train_batch_size: 8})",
                          R"({"train_batch_size": 8, "a": [,]})", R"({,"train_batch_size": 8})",
                          R"({"train_batch_size": 8, "zero_optimization": {,}})"})
    EXPECT_THROW(dtrain::zero::parse_config_text(bad, 1), dtrain::zero::ConfigError) << bad;
  // hjson makes an integral float an int only below 1e10: 9999999999.0 is an int, 1e10 a float
  // (which DeepSpeed's schedulers refuse as a step count).
  auto warmup = [](const std::string& steps) {
    return R"({"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {}},
               "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": )" +
           steps + "}}}";
  };
  EXPECT_EQ(dtrain::zero::parse_config_text(warmup("9999999999.0"), 1).scheduler.warmup_num_steps,
            9999999999);
  EXPECT_THROW(dtrain::zero::parse_config_text(warmup("1e10"), 1), dtrain::zero::ConfigError);
  EXPECT_THROW(dtrain::zero::parse_config_text(warmup("2e18"), 1), dtrain::zero::ConfigError);
}

// steps_per_print: DeepSpeed 0.19.8's default is None (no progress line); DeepSpeedConfig takes
// any value and its engine fails the first step on 0, false or a non-number; the line appears
// only at log_level info or debug.
TEST(ZeroConfig, StepsPerPrintAndLogLevelAsDeepSpeedUsesThem) {
  const json base = {{"train_batch_size", 4}};
  auto with = [&](const json& extra) {
    json j = base;
    j.update(extra);
    return j;
  };
  auto c = parse_config(base, 1);
  EXPECT_FALSE(c.steps_per_print.has_value());
  EXPECT_EQ(c.log_level, "");
  c = parse_config(with({{"steps_per_print", -4}, {"log_level", "INFO"}}), 1);
  EXPECT_EQ(*c.steps_per_print, -4);
  EXPECT_EQ(c.log_level, "info");
  EXPECT_EQ(dtrain::zero::progress_line(c, 8, 1, "[0.001]", "[(0.9, 0.999)]"),
            "[Rank 0] step=8, skipped=1, lr=[0.001], mom=[(0.9, 0.999)]");
  EXPECT_EQ(dtrain::zero::progress_line(c, 6, 0, "[0.001]", "[]"), "");
  c = parse_config(with({{"steps_per_print", 2.5}, {"log_level", "debug"}}), 1);
  EXPECT_NE(dtrain::zero::progress_line(c, 5, 0, "[1]", "[0]"), "");
  EXPECT_EQ(dtrain::zero::progress_line(c, 4, 0, "[1]", "[0]"), "");
  c = parse_config(with({{"steps_per_print", 1}}), 1);  // log_level warning: hidden
  EXPECT_EQ(dtrain::zero::progress_line(c, 1, 0, "[1]", "[0]"), "");
  EXPECT_NE(notes(c).find("steps_per_print: no progress line at log_level warning"),
            std::string::npos)
      << notes(c);
  // Step 0, when the engine is built: at log_level info whatever steps_per_print says.
  c = parse_config(with({{"log_level", "info"}}), 1);
  EXPECT_EQ(dtrain::zero::progress_line(c, 0, 0, "[0.001]", "[]"),
            "[Rank 0] step=0, skipped=0, lr=[0.001], mom=[]");
  EXPECT_EQ(dtrain::zero::progress_line(c, 3, 0, "[0.001]", "[]"), "");
  c = parse_config(with({{"steps_per_print", true}, {"log_level", "info"}}), 1);
  EXPECT_EQ(*c.steps_per_print, 1);
  EXPECT_EQ(parse_config(with({{"steps_per_print", nullptr}}), 1).steps_per_print, std::nullopt);
  EXPECT_NE(error_of(with({{"steps_per_print", 0}}))
                .find("steps_per_print: 0 fails DeepSpeed "
                      "0.19.8's first optimizer step "
                      "(ZeroDivisionError"),
            std::string::npos);
  EXPECT_NE(error_of(with({{"steps_per_print", false}})).find("ZeroDivisionError"),
            std::string::npos);
  EXPECT_NE(error_of(with({{"steps_per_print", "10"}})).find("TypeError"), std::string::npos);
  EXPECT_NE(error_of(with({{"log_level", "verbose"}}))
                .find("log_level: \"verbose\" is not a log level (allowed: debug, info"),
            std::string::npos);
  EXPECT_NE(error_of(with({{"log_level", 20}})).find("log_level: 20 is not a log level"),
            std::string::npos);
  // Python's repr of the floats in the line.
  const std::vector<std::pair<double, std::string>> reprs = {{0.001, "0.001"},
                                                             {1e-5, "1e-05"},
                                                             {1e-4, "0.0001"},
                                                             {100.0, "100.0"},
                                                             {1e16, "1e+16"},
                                                             {1e15, "1000000000000000.0"},
                                                             {0.1 + 0.2, "0.30000000000000004"},
                                                             {-2.5e-7, "-2.5e-07"},
                                                             {0.0, "0.0"}};
  for (const auto& [v, text] : reprs) EXPECT_EQ(dtrain::detail::python_float_repr(v), text);
}

// Keys DeepSpeed reads that dtrain does not act on are named in one note.
TEST(ZeroConfig, KeysNotActedOnAreNamedInOneNote) {
  auto c = parse_config({{"train_batch_size", 4},
                         {"wall_clock_breakdown", true},
                         {"memory_breakdown", false},
                         {"zero_optimization", {{"stage", 2}, {"round_robin_gradients", true}}}},
                        1);
  std::vector<std::string> about;
  for (const auto& n : c.notes)
    if (n.find("not acted on by dtrain") != std::string::npos) about.push_back(n);
  ASSERT_EQ(about.size(), 1u) << notes(c);
  for (const char* key :
       {"wall_clock_breakdown", "memory_breakdown", "zero_optimization.round_robin_gradients"})
    EXPECT_NE(about[0].find(key), std::string::npos) << about[0];
  EXPECT_EQ(notes(parse_config({{"train_batch_size", 4}}, 1)), "");
}

TEST(ZeroConfig, WrongTypesAndRangesAreNamed) {
  json base = {{"train_batch_size", 8}};
  auto with = [&](const json& extra) {
    json j = base;
    j.update(extra);
    return error_of(j);
  };
  EXPECT_EQ(with({{"zero_optimization", {{"stage", 4}}}}),
            "zero_optimization.stage: out of range: 4 (allowed: 0 .. 3)");
  EXPECT_EQ(with({{"zero_optimization", {{"stage", "two"}}}}),
            "zero_optimization.stage: expected an integer, got \"two\"");
  EXPECT_EQ(with({{"gradient_clipping", "1.0"}}),
            "gradient_clipping: expected a number, got \"1.0\"");
  EXPECT_EQ(with({{"fp16", {{"enabled", "sometimes"}}}}),
            "fp16.enabled: expected true or false, got \"sometimes\"");
  EXPECT_EQ(with({{"fp16", {{"enabled", true}, {"min_loss_scale", 0}}}}),
            "fp16.min_loss_scale: must be > 0 with dynamic loss scaling (loss_scale 0), got 0 "
            "(DeepSpeed 0.19.8 refuses it too)");
  EXPECT_EQ(with({{"optimizer", {{"type", "Adamw"}, {"params", {{"betas", {0.9}}}}}}}),
            "optimizer.params.betas: expected [beta1, beta2], got [0.9]");
  EXPECT_EQ(with({{"optimizer", {{"type", "Adamm"}}}}),
            "optimizer.type: unknown value \"Adamm\" (allowed: Adam, AdamW, SGD, Lamb, Adagrad, "
            "Lion, RMSprop; DeepSpeed 0.19.8 refuses it too: it matches Adam, AdamW, Lamb, "
            "Adagrad and Lion in any case, SGD, RMSprop and torch.optim's other names only "
            "exactly); did you mean Adam?");
  EXPECT_EQ(with({{"optimizer", {{"type", "OneBitAdam"}}}}),
            "optimizer.type: DeepSpeed 0.19.8 has no OneBitAdam optimizer any more (its "
            "compressed-communication optimizers were removed; it refuses the name too): use Adam "
            "(the same update, uncompressed)");
  EXPECT_NE(with({{"scheduler", {{"type", "WarmupDecayLR"}, {"params", json::object()}}}})
                .find("scheduler.params.total_num_steps: required"),
            std::string::npos);
  EXPECT_EQ(with({{"scheduler", {{"type", "WarmupDecayLR"}}}}),
            "scheduler.params: missing (DeepSpeed 0.19.8 fails without it too: it calls "
            "WarmupDecayLR(optimizer, **params)); give \"params\": {} for WarmupDecayLR's "
            "defaults");
  EXPECT_EQ(
      with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", "Linear"}}}}}}),
      "scheduler.params.warmup_type: unknown value \"Linear\" (allowed: log, linear); DeepSpeed "
      "0.19.8 would warn and warm up by log instead, and dtrain refuses it so that a typo cannot "
      "go unnoticed; did you mean linear?");
  EXPECT_NE(
      with({{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}).find("both enabled"),
      std::string::npos);
}

// Where DeepSpeed 0.19.8's own rules are less obvious (each also compared with DeepSpeed itself
// in zero_deepspeed_reference_test).
TEST(ZeroConfig, FollowsDeepSpeedsLessObviousRules) {
  auto notes = [](const Config& c) {
    std::string all;
    for (const auto& n : c.notes) all += n + "\n";
    return all;
  };
  // "bf16" wins over its old name "bfloat16", whatever the latter says.
  auto c = parse_config(
      {{"train_batch_size", 8}, {"bf16", {{"enabled", false}}}, {"bfloat16", {{"enabled", true}}}},
      2);
  EXPECT_FALSE(c.bf16);
  EXPECT_NE(notes(c).find("bfloat16: ignored"), std::string::npos) << notes(c);
  // Validated sections read values as pydantic does, with a note.
  c = parse_config({{"train_batch_size", 8},
                    {"fp16", {{"enabled", "true"}, {"loss_scale", "128"}}},
                    {"zero_optimization", {{"stage", "2"}}}},
                   2);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.loss_scale, 128);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_NE(notes(c).find("zero_optimization.stage: \"2\" read as 2"), std::string::npos);
  // fp16's window and minimum scale matter only with dynamic scaling.
  c = parse_config({{"train_batch_size", 8},
                    {"fp16", {{"enabled", true}, {"loss_scale", 64}, {"loss_scale_window", 0}}}},
                   2);
  EXPECT_EQ(c.fp16.loss_scale_window, 0);
  // torch_adam builds torch.optim.AdamW, whose weight decay defaults to 0.01.
  c = parse_config({{"train_batch_size", 8},
                    {"optimizer", {{"type", "AdamW"}, {"params", {{"torch_adam", true}}}}}},
                   2);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.01);
  // offload_param below stage 3: accepted and ignored, as DeepSpeed does.
  c = parse_config({{"train_batch_size", 8},
                    {"zero_optimization", {{"stage", 2}, {"offload_param", {{"device", "cpu"}}}}}},
                   2);
  EXPECT_NE(notes(c).find("offload_param: has no effect at stage 2"), std::string::npos);
  EXPECT_EQ(dtrain::zero::estimate_memory(c, 1000).offloaded, 0);
  // A deprecated key beside its replacement is refused even when false.
  EXPECT_NE(
      error_of(
          {{"train_batch_size", 8},
           {"zero_optimization",
            {{"stage", 2}, {"cpu_offload", false}, {"offload_optimizer", {{"device", "cpu"}}}}}})
          .find("zero_optimization.cpu_offload: given together with offload_optimizer"),
      std::string::npos);
  // compute_grad_norm false: stages 1-2 only, and without clipping (DeepSpeed's default 1.0).
  EXPECT_NE(error_of({{"train_batch_size", 8},
                      {"zero_optimization", {{"stage", 2}, {"compute_grad_norm", false}}}})
                .find("false needs \"gradient_clipping\": 0"),
            std::string::npos);
  // managed_gradient_accumulation: a boolean, false not with overlap_comm below stage 2.
  EXPECT_FALSE(parse_config({{"train_batch_size", 8}, {"managed_gradient_accumulation", false}}, 2)
                   .managed_gradient_accumulation);
  EXPECT_NE(error_of({{"train_batch_size", 8}, {"managed_gradient_accumulation", "no"}})
                .find("managed_gradient_accumulation"),
            std::string::npos);
  EXPECT_NE(error_of({{"train_batch_size", 8},
                      {"managed_gradient_accumulation", false},
                      {"zero_optimization", {{"stage", 1}, {"overlap_comm", true}}}})
                .find("false does not go with zero_optimization.overlap_comm at stage 1"),
            std::string::npos);
  // Names: DeepSpeed's own optimizers in any case, torch's and the schedulers exactly.
  EXPECT_EQ(
      parse_config({{"train_batch_size", 8}, {"optimizer", {{"type", "ADAMW"}}}}, 2).optimizer.type,
      "AdamW");
  EXPECT_NE(error_of({{"train_batch_size", 8}, {"optimizer", {{"type", "sgd"}}}})
                .find("did you mean SGD?"),
            std::string::npos);
  EXPECT_NE(error_of({{"train_batch_size", 8},
                      {"scheduler", {{"type", "warmuplr"}, {"params", json::object()}}}})
                .find("did you mean WarmupLR?"),
            std::string::npos);
  // SGD under ZeRO: dtrain runs it; the note says DeepSpeed wants zero_allow_untested_optimizer.
  c = parse_config({{"train_batch_size", 8},
                    {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
                    {"zero_optimization", {{"stage", 1}}}},
                   2);
  EXPECT_NE(notes(c).find("zero_allow_untested_optimizer"), std::string::npos) << notes(c);
}

// "Adagrad" by name: torch.optim.Adagrad's arguments and defaults, or with offload_optimizer
// DeepSpeedCPUAdagrad's (DeepSpeed 0.19.8's engine builds one or the other).
TEST(ZeroConfig, AdagradTakesTheArgumentsOfTheOptimizerDeepSpeedBuilds) {
  const json batch = {{"train_batch_size", 8}};
  auto with = [&](json extra) {
    json c = batch;
    c.update(extra);
    return c;
  };
  const json offload = {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}};
  // Any case; the defaults are torch's (and the CPU Adagrad's): lr 1e-2, eps 1e-10.
  auto c = parse_config(with({{"optimizer", {{"type", "adagrad"}}}}), 2);
  EXPECT_EQ(c.optimizer.type, "Adagrad");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-2);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-10);
  EXPECT_DOUBLE_EQ(c.optimizer.lr_decay, 0);
  EXPECT_DOUBLE_EQ(c.optimizer.initial_accumulator_value, 0);
  c = parse_config(with({{"optimizer",
                          {{"type", "Adagrad"},
                           {"params",
                            {{"lr", 0.1},
                             {"lr_decay", 0.01},
                             {"weight_decay", 0.001},
                             {"initial_accumulator_value", 0.5},
                             {"eps", 1e-8},
                             {"foreach", false}}}}},
                         {"zero_optimization", {{"stage", 3}}}}),
                   2);
  EXPECT_DOUBLE_EQ(c.optimizer.lr_decay, 0.01);
  EXPECT_DOUBLE_EQ(c.optimizer.initial_accumulator_value, 0.5);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  // A ZeRO-tested optimizer in DeepSpeed: no note about zero_allow_untested_optimizer.
  EXPECT_EQ(notes(c).find("zero_allow_untested_optimizer"), std::string::npos) << notes(c);
  // "auto": the optimizer's defaults, with a note.
  c = parse_config(
      with({{"optimizer", {{"type", "Adagrad"}, {"params", {{"lr", "auto"}, {"eps", "auto"}}}}}}),
      2);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-2);
  EXPECT_NE(notes(c).find("optimizer.params.lr: \"auto\": 1e-2"), std::string::npos) << notes(c);
  // With offload_optimizer: DeepSpeedCPUAdagrad(lr, eps, weight_decay, amsgrad,
  // fp32_optimizer_states); amsgrad is taken and ignored, as there.
  c = parse_config(
      with({{"optimizer",
             {{"type", "Adagrad"},
              {"params", {{"lr", 0.1}, {"amsgrad", true}, {"fp32_optimizer_states", true}}}}},
            {"zero_optimization", offload}}),
      2);
  EXPECT_NE(notes(c).find("optimizer.params.amsgrad"), std::string::npos) << notes(c);
  for (const char* key : {"lr_decay", "initial_accumulator_value", "foreach", "fused"}) {
    const std::string e =
        error_of(with({{"optimizer", {{"type", "Adagrad"}, {"params", {{key, 0}}}}},
                       {"zero_optimization", offload}}));
    EXPECT_NE(e.find(std::string("optimizer.params.") + key +
                     ": unknown key with offload_optimizer (DeepSpeed 0.19.8 refuses it too"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("DeepSpeedCPUAdagrad"), std::string::npos) << e;
  }
  // Without it, torch.optim.Adagrad has no amsgrad, no betas.
  std::string e =
      error_of(with({{"optimizer", {{"type", "Adagrad"}, {"params", {{"amsgrad", false}}}}}}));
  EXPECT_NE(e.find("optimizer.params.amsgrad: unknown key without offload_optimizer"),
            std::string::npos)
      << e;
  e = error_of(with({{"optimizer", {{"type", "Adagrad"}, {"params", {{"betas", {0.9, 0.99}}}}}}}));
  EXPECT_NE(e.find("optimizer.params.betas: unknown key (DeepSpeed 0.19.8 refuses it too: it "
                   "passes the key to torch.optim.Adagrad"),
            std::string::npos)
      << e;
  // Values torch.optim.Adagrad refuses, and one dtrain does not run.
  e = error_of(with({{"optimizer", {{"type", "Adagrad"}, {"params", {{"lr_decay", -0.1}}}}}}));
  EXPECT_NE(e.find("optimizer.params.lr_decay"), std::string::npos) << e;
  e = error_of(with({{"optimizer", {{"type", "Adagrad"}, {"params", {{"maximize", true}}}}}}));
  EXPECT_NE(e.find("optimizer.params.maximize: not supported by dtrain"), std::string::npos) << e;
  // At stage 0 under bf16 or fp16 DeepSpeed's FP16_UnfusedOptimizer cannot step
  // torch.optim.Adagrad (KeyError: 'sum' in deepspeed.initialize): refused as it fails there.
  e = error_of(with({{"optimizer", {{"type", "Adagrad"}}}, {"bf16", {{"enabled", true}}}}));
  EXPECT_NE(e.find("optimizer.type: Adagrad at stage 0 with bf16 fails in DeepSpeed 0.19.8 too"),
            std::string::npos)
      << e;
  // At stage 0 DeepSpeed runs its CPU Adagrad on the whole model, and so does dtrain (a note
  // says so); the memory estimate puts the whole state on the CPU.
  c = parse_config(
      with({{"optimizer", {{"type", "Adagrad"}}},
            {"zero_optimization", {{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}}}),
      4);
  EXPECT_TRUE(c.zero.offload_optimizer.enabled());
  EXPECT_NE(notes(c).find("zero_optimization.offload_optimizer: at stage 0: DeepSpeed's CPU "
                          "optimizer (DeepSpeedCPUAdam, DeepSpeedCPUAdagrad or DeepSpeedCPULion) "
                          "steps the whole, unpartitioned model"),
            std::string::npos)
      << notes(c);
  EXPECT_EQ(dtrain::zero::estimate_memory(c, 1000).offloaded, 4 * 1000);
  EXPECT_EQ(dtrain::zero::estimate_memory(c, 1000).optimizer, 0);
  EXPECT_NE(dtrain::zero::describe(c, std::nullopt).find("(DeepSpeedCPUAdagrad)"),
            std::string::npos);
  // And under bf16 there: DeepSpeedCPUAdagrad makes its state at its first step, which
  // torch.optim.Adagrad (refused above) made in its constructor.
  c = parse_config(
      with({{"optimizer", {{"type", "Adagrad"}}},
            {"bf16", {{"enabled", true}}},
            {"zero_optimization", {{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}}}),
      4);
  EXPECT_TRUE(c.bf16 && c.zero.offload_optimizer.enabled());

  // Memory: one fp32 state tensor (the sum of squares), not Adam's two.
  c = parse_config(
      with({{"optimizer", {{"type", "Adagrad"}}}, {"zero_optimization", {{"stage", 1}}}}), 4);
  EXPECT_EQ(dtrain::zero::estimate_memory(c, 1000000).optimizer, 4 * 1000000 / 4);
  EXPECT_NE(dtrain::zero::describe(c, std::nullopt)
                .find("Adagrad: lr 0.01, weight_decay 0.0, eps 1e-10, L2 decay, lr_decay 0.0, "
                      "initial_accumulator_value 0.0 (torch.optim.Adagrad)"),
            std::string::npos)
      << dtrain::zero::describe(c, std::nullopt);
}

// "Lion" by name: DeepSpeed's CPU Lion with offload_optimizer; without it DeepSpeed's CUDA
// FusedLion, whose update dtrain runs as tensor ops. Each takes its own params.
TEST(ZeroConfig, LionIsDeepSpeedsCpuLionWithOffloadAndFusedLionWithout) {
  const json offload = {{"stage", 1}, {"offload_optimizer", {{"device", "cpu"}}}};
  auto c =
      parse_config({{"train_batch_size", 8},
                    {"optimizer",
                     {{"type", "lion"},
                      {"params", {{"lr", 1e-4}, {"betas", {0.95, 0.98}}, {"weight_decay", 0.1}}}}},
                    {"zero_optimization", offload}},
                   2);
  EXPECT_EQ(c.optimizer.type, "Lion");
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_EQ(notes(c).find("zero_allow_untested_optimizer"), std::string::npos) << notes(c);
  EXPECT_EQ(dtrain::zero::estimate_memory(c, 1000).offloaded, 8 * 1000 / 2);  // as DeepSpeed's
  EXPECT_NE(dtrain::zero::describe(c, std::nullopt).find("(DeepSpeedCPULion)"), std::string::npos);
  // Without offload: FusedLion, one state tensor (its exp_avg), at every stage.
  for (int stage = 0; stage <= 3; ++stage) {
    c = parse_config({{"train_batch_size", 8},
                      {"optimizer", {{"type", "Lion"}, {"params", {{"set_grad_none", true}}}}},
                      {"zero_optimization", {{"stage", stage}}}},
                     2);
    EXPECT_EQ(c.optimizer.type, "Lion");
    EXPECT_EQ(dtrain::zero::estimate_memory(c, 1000).optimizer, stage == 0 ? 4000 : 4000 / 2);
    EXPECT_NE(dtrain::zero::describe(c, std::nullopt).find("(FusedLion)"), std::string::npos);
  }
  std::string e = error_of({{"train_batch_size", 8},
                            {"optimizer", {{"type", "Lion"}, {"params", {{"eps", 1e-8}}}}},
                            {"zero_optimization", offload}});
  EXPECT_NE(e.find("optimizer.params.eps: unknown key (DeepSpeed 0.19.8 refuses it too: it passes "
                   "the key to FusedLion (with offload_optimizer its DeepSpeedCPULion)"),
            std::string::npos)
      << e;
  e = error_of({{"train_batch_size", 8},
                {"optimizer", {{"type", "Lion"}, {"params", {{"set_grad_none", true}}}}},
                {"zero_optimization", offload}});
  EXPECT_NE(e.find("optimizer.params.set_grad_none: unknown key with offload_optimizer"),
            std::string::npos)
      << e;
  e = error_of({{"train_batch_size", 8},
                {"optimizer", {{"type", "Lion"}, {"params", {{"fp32_optimizer_states", true}}}}}});
  EXPECT_NE(e.find("optimizer.params.fp32_optimizer_states: unknown key without offload_optimizer "
                   "(DeepSpeed 0.19.8 refuses it too: it passes the key to FusedLion"),
            std::string::npos)
      << e;
}

// torch_autocast as DeepSpeed 0.19.8 reads it (runtime/config.py; its engine's behaviour is
// zero_deepspeed_parity_test's TwoRanks(Fp16)TorchAutocastAsDeepSpeed): what it refuses too, and
// what dtrain does not run (fp16 over 16-bit parameters), each named.
TEST(ZeroConfig, TorchAutocastAsDeepSpeedReadsIt) {
  auto with = [](const json& autocast, int stage = 2) {
    return json{{"train_batch_size", 8},
                {"torch_autocast", autocast},
                {"zero_optimization", {{"stage", stage}}}};
  };
  auto c = parse_config(with({{"enabled", true}, {"dtype", "torch.bfloat16"}}), 2);
  EXPECT_TRUE(c.torch_autocast.enabled);
  EXPECT_EQ(c.torch_autocast.dtype, "bf16");
  EXPECT_NE(
      dtrain::zero::describe(c, std::nullopt).find("the forward under torch.autocast in bf16"),
      std::string::npos);
  c = parse_config(with({{"enabled", true}}, 0), 2);
  EXPECT_EQ(c.torch_autocast.dtype, "");
  EXPECT_NE(dtrain::zero::describe(c, std::nullopt).find("the device's default dtype"),
            std::string::npos);
  c = parse_config(with({{"enabled", false}, {"lower_precision_safe_modules", "torch.nn.Linear"}}),
                   2);
  EXPECT_FALSE(c.torch_autocast.enabled);
  c = parse_config(with({{"enabled", true}, {"dtype", "float"}}), 2);
  EXPECT_NE(notes(c).find("torch_autocast.dtype: \"fp32\": torch.autocast takes bf16 and fp16 "
                          "only"),
            std::string::npos)
      << notes(c);
  json comm = with({{"enabled", true}, {"dtype", "bf16"}}, 1);
  comm["communication_data_type"] = "fp16";
  EXPECT_NE(notes(parse_config(comm, 2))
                .find("communication_data_type: not read under "
                      "torch_autocast at stages 1-3"),
            std::string::npos);
  const std::vector<std::pair<json, std::string>> refused = {
      {nullptr, "torch_autocast: null (DeepSpeed 0.19.8 fails on it too)"},
      {true, "torch_autocast: a boolean (DeepSpeed 0.19.8 fails on it too)"},
      {{{"enabled", false}, {"dtype", "bf17"}},
       "torch_autocast.dtype: unknown dtype \"bf17\" (allowed: bf16/bfloat16, fp16/float16/half"},
      {{{"enabled", false}, {"lower_precision_safe_modules", {1}}},
       "torch_autocast.lower_precision_safe_modules: must be a list of module class names"},
      {{{"enabled", true}, {"lower_precision_safe_modules", "torch.nn.Linear"}},
       "a string, not a list: DeepSpeed 0.19.8 takes each of its characters"},
      {{{"enabled", true}, {"lower_precision_safe_modules", {"Linear"}}},
       "\"Linear\" has no package"},
      {{{"enabled", "yes"}}, "torch_autocast.enabled: expected true or false"},
      {{{"enabled", true}, {"dtype", "int8"}}, "torch_autocast.dtype: int8"},
  };
  for (const auto& [autocast, message] : refused) {
    const std::string e = error_of(with(autocast), 2);
    EXPECT_NE(e.find(message), std::string::npos) << autocast.dump() << "\n" << e;
  }
  // fp16: the GradScaler over fp32 parameters; over 16-bit ones DeepSpeed fails (bf16) or
  // unscales twice (fp16).
  c = parse_config(with({{"enabled", true}, {"dtype", "half"}}), 2);
  EXPECT_EQ(c.torch_autocast.dtype, "fp16");
  EXPECT_NE(dtrain::zero::describe(c, std::nullopt)
                .find("torch.amp.GradScaler: initial scale 2^16 = 65536, x2 after 2000 steps"),
            std::string::npos);
  for (const char* section : {"fp16", "bf16"}) {
    json both = with({{"enabled", true}, {"dtype", "float16"}});
    both[section] = {{"enabled", true}};
    const std::string e = error_of(both, 2);
    EXPECT_NE(e.find("torch_autocast.dtype: fp16 torch_autocast with the " + std::string(section) +
                     " section enabled is not supported by dtrain"),
              std::string::npos)
        << e;
  }
  EXPECT_TRUE(parse_config(with({{"enabled", true}}, 3), 2).torch_autocast.enabled);
  // Off, fp16 is DeepSpeed's alone: accepted.
  EXPECT_FALSE(
      parse_config(with({{"enabled", false}, {"dtype", "fp16"}}, 3), 2).torch_autocast.enabled);
}

TEST(ZeroConfig, ReadsDeepSpeedsSectionsAndDefaults) {
  auto c = parse_config(json::parse(R"({
    "train_batch_size": 16, "gradient_accumulation_steps": 2, "steps_per_print": 5, "wall_clock_breakdown": false,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 10}},
    "fp16": {"enabled": true, "initial_scale_power": 12, "hysteresis": 3},
    "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 3, "reduce_bucket_size": 5e7, "stage3_prefetch_bucket_size": "auto",
                          "offload_optimizer": {"device": "cpu", "pin_memory": true}, "offload_param": {"device": "cpu"}}
  })"),
                        2);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 4);
  EXPECT_EQ(c.optimizer.type, "AdamW");
  EXPECT_TRUE(c.optimizer.adam_w_mode);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_EQ(c.scheduler.total_num_steps, 1000);
  EXPECT_EQ(c.scheduler.warmup_type, "log");  // DeepSpeed's default
  EXPECT_EQ(c.fp16.initial_scale_power, 12);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.reduce_bucket_size, 50000000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 5000000);  // "auto": dtrain's default
  EXPECT_TRUE(c.zero.offload_optimizer.enabled());
  EXPECT_TRUE(c.zero.offload_param.enabled());
}

TEST(ZeroConfig, MemoryEstimateFollowsTheZeroFormulas) {
  auto c = parse_config({{"train_batch_size", 8},
                         {"bf16", {{"enabled", true}}},
                         {"zero_optimization", {{"stage", 0}}}},
                        4);
  const int64_t n = 1000000;
  auto m = dtrain::zero::estimate_memory(c, n);
  EXPECT_EQ(m.total(), 16 * n);  // 2 + 2 + 12
  c.zero.stage = 1;
  EXPECT_EQ(dtrain::zero::estimate_memory(c, n).total(), 4 * n + 12 * n / 4);
  c.zero.stage = 2;
  EXPECT_EQ(dtrain::zero::estimate_memory(c, n).total(), 2 * n + 14 * n / 4);
  c.zero.stage = 3;
  EXPECT_EQ(dtrain::zero::estimate_memory(c, n).total(), 16 * n / 4);
}

TEST(ZeroCheckCommand, PrintsResolvedBatchSizesAndMemory) {
  auto r =
      dtrain::test::run_command({DTRAIN_BIN, "zero", "check",
                                 R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                                          "zero_optimization": {"stage": 2}})",
                                 "--world-size", "4", "--params", "100000000"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("gradient_accumulation_steps    4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("gradients  95.4 MiB"), std::string::npos) << r.out;   // 4 bytes * 1e8 / 4
  EXPECT_NE(r.out.find("optimizer  190.7 MiB"), std::string::npos) << r.out;  // 8 bytes * 1e8 / 4
}

// What a run will use, resolved, without reading C++: the loss scaler, buckets, optimizer and
// scheduler with their params; notes on stderr.
TEST(ZeroCheckCommand, PrintsTheResolvedValuesAndNotesOnStderr) {
  auto r = dtrain::test::run_command({DTRAIN_BIN, "zero", "check",
                                      R"({"train_batch_size": 32, "gradient_accumulation_steps": 2,
          "fp16": {"enabled": true, "initial_scale_power": 12, "hysteresis": 3},
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.01}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 100}},
          "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e6},
          "steps_per_print": 10, "wall_clock_breakdown": true})",
                                      "--world-size", "4"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* line :
       {"train_micro_batch_size_per_gpu 4\n", "gradient_accumulation_steps    2\n",
        "loss scaler                    dynamic: initial scale 2^12 = 4096.0, window 1000, "
        "hysteresis 3, min 1.0\n",
        "reduce_bucket_size             2000000 elements\n",
        "optimizer                      AdamW: lr 0.0003, weight_decay 0.01, betas [0.9, 0.999], "
        "eps 1e-08\n",
        "scheduler                      WarmupLR: warmup_min_lr 0.0, warmup_max_lr 0.0003, "
        "warmup_num_steps 100, warmup_type log\n",
        "gradient_clipping              1.0\n",
        "steps_per_print                10 (hidden at log_level warning)\n"})
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  EXPECT_EQ(r.out.find("note:"), std::string::npos) << r.out;
  auto help = dtrain::test::run_command({DTRAIN_BIN, "zero", "check", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_NE(help.out.find("usage: dtrain zero check CONFIG --world-size N"), std::string::npos);
  EXPECT_NE(r.err.find("dtrain zero: note: wall_clock_breakdown: read and type-checked"),
            std::string::npos)
      << r.err;
}

// The three stage-3 defaults dtrain sets apart from DeepSpeed's (overlap_comm,
// stage3_prefetch_bucket_size, stage3_max_reuse_distance): `zero check` names DeepSpeed's value,
// asked of the venv's DeepSpeed itself, where the config leaves the key out or says "auto", and
// says nothing where it is given or at another stage.
TEST(ZeroCheckCommand, Stage3RowsSayWhereDtrainsDefaultIsNotDeepSpeeds) {
  auto ds = dtrain::test::run_command(
      {DTRAIN_VENV_PYTHON, "-c",
       "from deepspeed.runtime.zero.config import DeepSpeedZeroConfig as C\n"
       "c = C(stage=3)\n"
       "print(str(c.overlap_comm).lower(), c.prefetch_bucket_size, c.max_reuse_distance)"},
      {.timeout = std::chrono::seconds(120)});
  ASSERT_EQ(ds.exit_code, 0) << "DeepSpeed in the venv (scripts/setup.sh): " << ds.err;
  std::istringstream in(ds.out.substr(ds.out.rfind('\n', ds.out.size() - 2) + 1));
  std::string overlap, prefetch, reuse;
  in >> overlap >> prefetch >> reuse;
  auto check = [](const std::string& config) {
    return dtrain::test::run_command({DTRAIN_BIN, "zero", "check", config, "--world-size", "2"});
  };
  auto r = check(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": "auto"}})");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& [key, ours, theirs] :
       {std::tuple<std::string, std::string, std::string>{"overlap_comm", "false", overlap},
        {"stage3_prefetch_bucket_size", "5000000", prefetch},
        {"stage3_max_reuse_distance", "0", reuse}}) {
    const std::string row = ours + " (dtrain's default; DeepSpeed 0.19.8's at stage 3 is " + theirs;
    EXPECT_NE(r.out.find(row), std::string::npos) << key << ": " << row << "\n" << r.out;
    EXPECT_NE(ours, theirs) << key << ": the defaults agree now; drop the note";
  }
  r = check(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": false,
                "stage3_prefetch_bucket_size": 5000000, "stage3_max_reuse_distance": 0}})");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("dtrain's default"), std::string::npos) << r.out;
  r = check(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})");
  EXPECT_EQ(r.out.find("dtrain's default"), std::string::npos) << r.out;
}

TEST(ZeroCheckCommand, OutOfRangeCountsAndEndlessFilesAreRefused) {
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::string ok = R"({"train_micro_batch_size_per_gpu": 1})";
  const std::string huge =
      R"({"train_micro_batch_size_per_gpu": 2147483647, "gradient_accumulation_steps": 2147483647})";
  const std::vector<Case> cases = {
      // Once narrowed to int: "config OK for world size 1215752191".
      {{ok, "--world-size", "99999999999"},
       "--world-size expects a positive integer up to 1048576, got '99999999999'"},
      // Once negative MiB.
      {{ok, "--world-size", "2", "--params", "9e18"},
       "--params expects a positive integer up to 1000000000000000"},
      // Once a wrapped-around train_batch_size, "config OK".
      {{huge, "--world-size", "1048576"},
       "train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size: too large"},
      // Once read until memory ran out.
      {{"/dev/zero", "--world-size", "2"}, "/dev/zero: larger than 16 MiB"},
      {{"/tmp", "--world-size", "2"}, "/tmp: is a directory"}};
  for (const auto& c : cases) {
    std::vector<std::string> argv = {DTRAIN_BIN, "zero", "check"};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = dtrain::test::run_command(argv, {.timeout = std::chrono::seconds(60)});
    EXPECT_EQ(r.exit_code, 2) << c.args[0] << "\n" << r.out << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << r.err;
  }
}

TEST(ZeroCheckCommand, BadConfigIsExitCodeTwoWithThePath) {
  auto path =
      std::filesystem::temp_directory_path() / ("zero_bad_" + std::to_string(::getpid()) + ".json");
  {
    std::ofstream(path)
        << R"({"train_batch_size": 8, "zero_optimization": {"stage3_prefetch_bucket_sise": 1}})";
  }
  auto r =
      dtrain::test::run_command({DTRAIN_BIN, "zero", "check", path.string(), "--world-size", "2"});
  std::filesystem::remove(path);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("zero_optimization.stage3_prefetch_bucket_sise: unknown key (DeepSpeed "
                       "0.19.8 refuses it too); did you mean stage3_prefetch_bucket_size?"),
            std::string::npos)
      << r.err;
  r = dtrain::test::run_command(
      {DTRAIN_BIN, "zero", "check", "/nonexistent/ds.json", "--world-size", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/ds.json: cannot read the config file"), std::string::npos)
      << r.err;
  r = dtrain::test::run_command({DTRAIN_BIN, "zero", "check", "{}"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--world-size N is required"), std::string::npos) << r.err;
}

// DeepSpeedExamples' imagenet configs carry "cuda_visible_devices" for their own script: DeepSpeed
// ignores it, `dtrain zero check` accepts it with a note, and refuses it with --strict.
TEST(ZeroCheckCommand, StrictRefusesKeysDeepSpeedIgnores) {
  const std::string text =
      R"({"train_batch_size": 8, "cuda_visible_devices": "0", "timers": {"wall": true}})";
  auto r = dtrain::test::run_command({DTRAIN_BIN, "zero", "check", text, "--world-size", "2"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("config OK for world size 2"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("dtrain zero: note: cuda_visible_devices: unknown key, not read by "
                       "DeepSpeed 0.19.8 (it ignores it) and ignored by dtrain too"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("dtrain zero: note: timers.wall: unknown key"), std::string::npos) << r.err;
  r = dtrain::test::run_command({DTRAIN_BIN, "zero", "check",
                                 R"({"train_batch_size": 8, "cuda_visible_devices": "0"})",
                                 "--world-size", "2", "--strict"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("dtrain zero: invalid config: cuda_visible_devices: unknown key (DeepSpeed "
                       "0.19.8 would silently ignore it; dtrain refuses it in strict mode"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

}  // namespace
