// A stand-in for CUDA's driver library (soname libcuda.so.1) for the fork server's tests on
// machines without a GPU: the two calls the fork server's check depends on, answering as the
// driver does - cuCtxGetCurrent gives CUDA_ERROR_NOT_INITIALIZED (3) until cuInit ran.
namespace {
bool g_initialised = false;
}

extern "C" __attribute__((visibility("default"))) int cuInit(unsigned int) {
  g_initialised = true;
  return 0;
}

extern "C" __attribute__((visibility("default"))) int cuCtxGetCurrent(void** ctx) {
  if (!g_initialised) return 3;
  *ctx = nullptr;  // initialised, no context current
  return 0;
}
