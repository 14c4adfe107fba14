// Pinned output fingerprints on the CUDA backend (tests/fingerprint_cases.h), one
// section per attention path of tests/data/fingerprints.json: "cuda cudnn" (the
// default where the build has cuDNN) and "cuda native" (numerics attention native, set
// on the backend: Backend::set_numerics).
// The cases and inputs are the CPU test's; kv_tile is set explicitly in every case.
//
// Until a section is recorded the test FAILS (no silent pass) and prints the observed
// values as a JSON block: after checking the run is the intended numerics, paste it
// into tests/data/fingerprints.json and add an entry to docs/numerics.md ("Fingerprint
// changes"). Changing a recorded value is a deliberate act, recorded the same way.
// Skips without a GPU; the cuDNN section also skips in a build without cuDNN.
#include "backend/cuda/attention_cudnn.cuh"
#include "fingerprint_cases.h"

namespace ls::test::fingerprint {
namespace {

std::unique_ptr<Backend> cuda_or_skip(std::string* why, AttentionAlgorithm attention) {
  Numerics n;
  n.attention = attention;
  auto b = make_backend("cuda", n, {});
  if (!b.ok()) {
    *why = b.error().message;
    return nullptr;
  }
  return std::move(*b);
}

TEST(FingerprintsCuda, CudnnAttentionMatchesRecorded) {
  std::string why;
  if (!cuda::attention_cudnn_built()) GTEST_SKIP() << "this build has no cuDNN";
  auto be = cuda_or_skip(&why, AttentionAlgorithm::cudnn);
  if (!be) GTEST_SKIP() << "no CUDA device: " << why;
  ASSERT_EQ(be->numerics().attention, AttentionAlgorithm::cudnn);
  // The default numerics of a cuDNN build are this section's: auto resolves to cudnn.
  auto dflt = cuda_or_skip(&why, AttentionAlgorithm::backend_default);
  ASSERT_TRUE(dflt != nullptr) << why;
  EXPECT_EQ(dflt->numerics(), be->numerics());
  check_section("cuda cudnn", *be);
}

TEST(FingerprintsCuda, NativeAttentionMatchesRecorded) {
  std::string why;
  auto be = cuda_or_skip(&why, AttentionAlgorithm::native);
  if (!be) GTEST_SKIP() << "no CUDA device: " << why;
  ASSERT_EQ(be->numerics().attention, AttentionAlgorithm::native);
  check_section("cuda native", *be);
}

}  // namespace
}  // namespace ls::test::fingerprint
