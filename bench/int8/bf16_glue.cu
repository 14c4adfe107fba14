// The symbols attention_hopper.cu takes from cuda_backend.cu, which the standalone INT8
// harness does not link (that file needs the whole CUDA backend): same behaviour.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_common.cuh"

namespace ls::cuda {
void cuda_check_failed(const char* call, const char* func, const char* file, int line, const char* what) {
  std::fprintf(stderr, "CUDA call failed: %s\n  in %s at %s:%d\n  error: %s\n", call, func, file, line, what);
  std::fflush(stderr);
  std::abort();
}
Status unsupported(const char* op, const std::string& detail) {
  return make_error(ErrorCode::unsupported, std::string("cuda ") + op + ": " + detail);
}
}  // namespace ls::cuda
