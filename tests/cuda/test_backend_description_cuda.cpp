// The CUDA backend's description (backend/description.h) against what the CUDA backend
// actually asks for: the workspace pieces its ops carve (gemm.cu, linear_quant.cu,
// attention_cudnn.cu's own sizing functions) and, on a device, the live backend's
// workspace_bytes(), resolved kv_tile and the planner's profile of it, for each attention
// path and cuDNN query chunk. The dry run (`layerstream info`) plans from the same
// description, so this is what keeps its figures true.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend/cuda/attention_cudnn.cuh"
#include "backend/cuda/attention_hopper.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/linear_quant_bench.cuh"
#include "backend/description.h"
#include "description_util.h"
#include "exec/planner.h"

namespace ls::cuda {
size_t gemm_workspace_bytes();  // ops.cuh (which needs the CUDA headers)
}

using namespace ls;

namespace {
bool build_has_cudnn_and_hopper(const BackendDescription& d) {
  return d.attention(AttentionAlgorithm::cudnn)->available && d.attention(AttentionAlgorithm::hopper)->available;
}
}  // namespace

TEST(BackendDescriptionCuda, PiecesAreWhatTheOpsCarve) {
  // No device needed: the sizing functions of the op files themselves.
  const CudaBuild build = cuda_build();
  EXPECT_EQ(build.cudnn, cuda::attention_cudnn_built());
  EXPECT_EQ(build.hopper, cuda::attention_hopper_built());
  const BackendDescription d = cuda_description(build);
  EXPECT_EQ(d.gemm_workspace_bytes, cuda::gemm_workspace_bytes());
  EXPECT_EQ(d.linear_quant_workspace_bytes, cuda::linear_quant_workspace_bytes());
  const AttentionEntry* cudnn = d.attention(AttentionAlgorithm::cudnn);
  ASSERT_NE(cudnn, nullptr);
  EXPECT_EQ(cudnn->available, build.cudnn);
  for (int64_t q : {int64_t{64}, int64_t{1024}, kDefaultCudnnQChunk, int64_t{4096}})
    for (auto [h, dh] : {std::pair<int64_t, int64_t>{64, 128}, {56, 128}, {1, 3}, {8, 64}}) {
      Numerics n;
      n.cudnn_q_chunk = q;
      EXPECT_EQ(cudnn->workspace_bytes(n, h, dh), cuda::attention_cudnn_workspace_bytes(h, dh, q))
          << h << " x " << dh << " q_chunk " << q;
    }
}

TEST(BackendDescriptionCuda, LiveBackendAsksWhatTheDescriptionSays) {
  auto b = make_backend("cuda");
  if (!b.ok()) GTEST_SKIP() << "no CUDA backend here: " << b.error().message;
  const BackendDescription d = describe_backend(**b);
  EXPECT_EQ(d.kind, DeviceKind::cuda);
  struct Case {
    AttentionAlgorithm attention;
    int64_t q_chunk;
  };
  for (const Case c : {Case{AttentionAlgorithm::backend_default, 2048}, Case{AttentionAlgorithm::native, 2048},
                       Case{AttentionAlgorithm::backend_default, 4096}, Case{AttentionAlgorithm::cudnn, 1024},
                       Case{AttentionAlgorithm::hopper, 2048}}) {
    Numerics n;
    n.attention = c.attention;
    n.cudnn_q_chunk = c.q_chunk;
    auto be = make_backend("cuda", n, {});
    if (!be.ok()) {
      // Refused: the description says the algorithm cannot run in this build (or, for
      // hopper, the device is not sm_90: the one refusal only a device can give).
      EXPECT_TRUE(!d.can_implement_attention(c.attention).ok() || c.attention == AttentionAlgorithm::hopper)
          << be.error().message;
      continue;
    }
    const Numerics r = (*be)->numerics();
    const std::string what = describe(r);
    // The workspace the ops ask for, as the backend says it and as the description says it.
    EXPECT_EQ((*be)->workspace_bytes(), d.workspace_bytes(r)) << what;
    EXPECT_EQ((*be)->default_kv_tile(), d.default_kv_tile(r.attention)) << what;
    // The planner's profile of the live backend is the dry run's for the same numerics
    // (the dry run assumes cuDNN and the Hopper kernel built: compared in this build's terms).
    const exec::DeviceProfile live = exec::device_profile(**be);
    const exec::DeviceProfile doc = exec::device_profile(d, r);
    EXPECT_EQ(live.workspace_bytes, doc.workspace_bytes) << what;
    EXPECT_EQ(live.default_kv_tile, doc.default_kv_tile) << what;
    EXPECT_EQ(live.attention_row_quantum, doc.attention_row_quantum) << what;
    EXPECT_EQ(live.throughput.attention_tflops, doc.throughput.attention_tflops) << what;
    if (build_has_cudnn_and_hopper(d)) {
      const exec::DeviceProfile dry = test::cuda_profile(r.attention, {}, c.q_chunk);
      EXPECT_EQ(live.workspace_bytes, dry.workspace_bytes) << what;
      EXPECT_EQ(live.attention_row_quantum, dry.attention_row_quantum) << what;
    }
  }
}
