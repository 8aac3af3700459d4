// dtrain-zero: the libtorch half of `dtrain zero` (the CLI runs it from beside itself).
//   dtrain-zero to-fp32 CHECKPOINT_DIR OUT [--tag TAG]
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
    auto sd = dtrain::zero::consolidated_state_dict(dir, tag);
    dtrain::zero::save_state_dict(sd, out);
    int64_t n = 0;
    for (auto& item : sd) n += item.value().numel();
    std::cout << "wrote " << sd.size() << " tensors (" << n << " elements) to " << out << "\n";
    return 0;
  } catch (const dtrain::UsageError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "dtrain zero to-fp32: " << e.what() << "\n";
    return 1;
  }
}
