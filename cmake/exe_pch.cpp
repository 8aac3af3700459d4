// The source that dtrain_exe_pch (CMakeLists.txt) needs to exist: it only carries the
// precompiled <torch/torch.h> that the examples, benchmarks and tests reuse.
