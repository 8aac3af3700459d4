// dtrain-zero: the libtorch half of `dtrain zero` (the CLI runs it from beside itself).
//   dtrain-zero to-fp32 CHECKPOINT_DIR OUT [--tag TAG]
#include <filesystem>
#include <iostream>

#include "dtrain/zero.h"

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  try {
    if (a.empty() || a[0] != "to-fp32")
      throw dtrain::UsageError("usage: dtrain zero to-fp32 CHECKPOINT_DIR OUT [--tag TAG]");
    std::string dir, out, tag;
    for (size_t i = 1; i < a.size(); ++i) {
      if (a[i] == "--tag" && i + 1 < a.size())
        tag = a[++i];
      else if (a[i] == "--tag")
        throw dtrain::UsageError(
            "dtrain zero to-fp32: --tag needs a value (a tag such as "
            "global_step100, a directory in CHECKPOINT_DIR)");
      else if (a[i].rfind("--", 0) == 0)
        throw dtrain::UsageError("dtrain zero to-fp32: unknown flag " + a[i]);
      else if (dir.empty())
        dir = a[i];
      else if (out.empty())
        out = a[i];
      else
        throw dtrain::UsageError("dtrain zero to-fp32: unexpected argument '" + a[i] + "'");
    }
    if (dir.empty() || out.empty())
      throw dtrain::UsageError("usage: dtrain zero to-fp32 CHECKPOINT_DIR OUT [--tag TAG]");
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      throw dtrain::UsageError("dtrain zero to-fp32: " + dir +
                               (fs::exists(dir, ec) ? " is not a directory" : " does not exist") +
                               "; give the checkpoint directory (the one save_checkpoint wrote)");
    if (fs::is_directory(out, ec))
      throw dtrain::UsageError("dtrain zero to-fp32: " + out +
                               " is a directory; give the file to write (e.g. " +
                               (fs::path(out) / "pytorch_model.bin").string() + ")");
    // Beside the tags is where DeepSpeed's zero_to_fp32.py writes (it runs in the checkpoint
    // directory); into a tag, or over `latest`, would replace what this reads.
    const auto abs_dir = fs::weakly_canonical(fs::absolute(dir)),
               abs_out = fs::weakly_canonical(fs::absolute(out));
    const auto rel = abs_out.lexically_relative(abs_dir);
    const auto parts = std::distance(rel.begin(), rel.end());
    if (!rel.empty() && *rel.begin() != ".." && (parts > 1 || rel == "latest" || rel == "."))
      throw dtrain::UsageError("dtrain zero to-fp32: " + out +
                               " would replace part of the checkpoint in " + dir +
                               "; write the consolidated file beside the tags or outside it");
    auto sd = dtrain::zero::consolidated_state_dict(dir, tag);
    dtrain::zero::save_state_dict(sd, out);
    int64_t n = 0;
    for (auto& item : sd) n += item.value().numel();
    std::cout << "wrote " << sd.size() << " tensors (" << n << " elements) to " << out << "\n";
    return 0;
  } catch (const dtrain::UsageError& e) {
    // The library's messages name its part ("zero to-fp32: ...", "zero checkpoint: ..."); the
    // command's own are whole ("dtrain zero to-fp32: ...", "usage: ...").
    const std::string what = e.what();
    std::cerr << (what.rfind("zero ", 0) == 0 ? "dtrain " : "") << what << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain zero to-fp32: " << e.what() << "\n";
    return 1;
  }
}
