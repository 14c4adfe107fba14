// The dry run's CUDA profile for tests: the CUDA backend's description (of a build with
// cuDNN and the Hopper kernel unless `build` says otherwise) resolved for an attention
// algorithm and cuDNN query chunk without a device, as `layerstream info` plans it.
#pragma once

#include "backend/description.h"
#include "exec/budget_plan.h"

namespace ls::test {

inline exec::DeviceProfile cuda_profile(AttentionAlgorithm attention = AttentionAlgorithm::backend_default,
                                        CudaBuild build = {}, int64_t q_chunk = kDefaultCudnnQChunk) {
  Numerics n;
  n.attention = attention;
  n.cudnn_q_chunk = q_chunk;
  const BackendDescription d = cuda_description(build);
  Expected<Numerics> r = exec::resolve_described(d, n);
  LS_CHECK_MSG(r.ok(), r.ok() ? "" : r.error().message);
  return exec::device_profile(d, *r);
}

}  // namespace ls::test
