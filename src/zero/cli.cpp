// `dtrain zero check CONFIG --world-size N [--params P] [--strict]` and `dtrain zero to-fp32 CKPT
// OUT`. The CLI links no libtorch; to-fp32 runs the `dtrain-zero` helper installed beside it.
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <sstream>

#include "core/paths.h"
#include "dtrain/zero_config.h"

namespace dtrain::zero {
namespace {

const char* kUsage =
    "usage: dtrain zero check CONFIG --world-size N [--params P] [--strict]\n"
    "         validate a DeepSpeed JSON config (file or JSON text, read as DeepSpeed reads it);\n"
    "         print the resolved values (batch sizes, precision and loss scaler, buckets,\n"
    "         optimizer and scheduler with their params, clipping, progress printing) and, with\n"
    "         --params, the per-rank memory of P parameters' model states; notes (keys resolved,\n"
    "         ignored or not acted on) go to stderr; --strict refuses every unknown key, also\n"
    "         those DeepSpeed ignores (by default accepted with a note unless near a known key)\n"
    "       dtrain zero to-fp32 CHECKPOINT_DIR OUT [--tag TAG]\n"
    "         consolidate a ZeRO checkpoint (all ranks' partitions) into one fp32 state dict\n";

// A positive integer up to `max` (the memory estimate multiplies --params by 16 bytes, and a
// world size is an int).
constexpr double kMaxWorld = 1 << 20, kMaxParams = 1e15;

int64_t parse_count(const std::string& flag, const std::string& v, double max) {
  try {
    size_t used = 0;
    double d = std::stod(v, &used);
    if (used != v.size() || !(d >= 1 && d <= max) ||
        d != static_cast<double>(static_cast<int64_t>(d)))
      throw std::invalid_argument(v);
    return static_cast<int64_t>(d);
  } catch (const std::exception&) {
    std::ostringstream m;
    m << static_cast<int64_t>(max);
    throw UsageError("dtrain zero check: " + flag + " expects a positive integer up to " + m.str() +
                     ", got '" + v + "'");
  }
}

int check(const std::vector<std::string>& a) {
  std::string config;
  int64_t world = -1;
  std::optional<int64_t> params;
  ParseOptions options;
  for (size_t i = 0; i < a.size(); ++i) {
    auto value = [&](const std::string& flag) -> std::string {
      if (i + 1 >= a.size()) throw UsageError("dtrain zero check: " + flag + " needs a value");
      return a[++i];
    };
    if (a[i] == "--help" || a[i] == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (a[i] == "--world-size")
      world = parse_count("--world-size", value("--world-size"), kMaxWorld);
    else if (a[i] == "--params")
      params = parse_count("--params", value("--params"), kMaxParams);
    else if (a[i] == "--strict")
      options.strict = true;
    else if (a[i].rfind("--world-size=", 0) == 0)
      world = parse_count("--world-size", a[i].substr(13), kMaxWorld);
    else if (a[i].rfind("--params=", 0) == 0)
      params = parse_count("--params", a[i].substr(9), kMaxParams);
    else if (a[i].rfind("--", 0) == 0)
      throw UsageError("dtrain zero check: unknown flag " + a[i] + "\n" + kUsage);
    else if (config.empty())
      config = a[i];
    else
      throw UsageError("dtrain zero check: unexpected argument '" + a[i] + "'\n" + kUsage);
  }
  if (config.empty()) throw UsageError(std::string("dtrain zero check: CONFIG missing\n") + kUsage);
  if (world < 1)
    throw UsageError(std::string("dtrain zero check: --world-size N is required\n") + kUsage);
  auto c = parse_config_text(config, static_cast<int>(world), options);
  std::cout << describe(c, params);
  for (const auto& note : c.notes) std::cerr << "dtrain zero: note: " << note << "\n";
  return 0;
}

}  // namespace

int zero_main(const std::vector<std::string>& args) {
  try {
    if (args.empty() || args[0] == "--help" || args[0] == "-h") {
      std::cout << kUsage;
      return args.empty() ? 2 : 0;
    }
    if (args[0] == "check") return check({args.begin() + 1, args.end()});
    if (args[0] == "to-fp32") {
      const auto self = read_self_exe();
      const auto helper =
          (self ? std::filesystem::path(self->path).parent_path() : std::filesystem::path(".")) /
          "dtrain-zero";
      if (!is_executable_file(helper.string()))
        throw UsageError(
            "dtrain zero to-fp32 needs the dtrain-zero helper (it links libtorch), expected at " +
            helper.string() + "; build or install it with dtrain");
      std::vector<std::string> argv{helper.string()};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<char*> cargv;
      for (auto& s : argv) cargv.push_back(s.data());
      cargv.push_back(nullptr);
      ::execv(helper.c_str(), cargv.data());
      throw Error("dtrain zero to-fp32: cannot run " + helper.string());
    }
    throw UsageError("dtrain zero: unknown command '" + args[0] + "'\n" + kUsage);
  } catch (const ConfigError& e) {
    std::cerr << "dtrain zero: invalid config: " << e.what() << "\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain zero: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace dtrain::zero
