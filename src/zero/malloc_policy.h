// How ZeRO asks the C library to hand freed buffers back to the system (see the .cpp).
#pragma once

namespace dtrain::zero::detail {

// glibc raises its mmap threshold to the largest block freed so far (up to 32 MiB), after which
// buffers of that size come from the heap, whose freed memory mostly stays in the process: the
// layers a partitioned construction frees and the gathered parameters and gradients a step
// frees would then hold the process's RSS near the sum of everything ever allocated. This fixes
// the threshold at 1 MiB (once per process), so large buffers are mmap-ed and a freed one
// leaves at once. Left alone when the user set MALLOC_MMAP_THRESHOLD_ (glibc's own variable);
// a no-op without glibc. Thread-safe.
void keep_large_buffers_unmapped();

}  // namespace dtrain::zero::detail
