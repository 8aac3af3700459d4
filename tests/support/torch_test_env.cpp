// Linked into every test binary that uses libtorch; runs before main().
//
// PyTorch 2.x's flight recorder (c10d::FlightRecorder, on by default for Gloo) inserts each
// process group's status into a map outside its mutex on the group's first collective
// (recordWithResetEnabled, 2.11). Our tests run several ranks as threads of one process, so
// two groups can record their first collective at the same moment and corrupt that map
// (SIGSEGV in _Rb_tree_insert_and_rebalance). One rank per process - how dtrain runs
// training - never races there. The recorder reads this variable once, when first used.
#include <cstdlib>

namespace {
const bool flight_recorder_off = [] { return ::setenv("TORCH_FR_BUFFER_SIZE", "0", 0) == 0; }();
}  // namespace
