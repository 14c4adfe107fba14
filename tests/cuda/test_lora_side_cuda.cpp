// The LoRA side path on the GPU (issue 17; backend.h Backend::lora_side): the CUDA kernel
// gives the CPU reference's bytes (memcmp) for random shapes up to the real H3 widths and
// rank kLoraSideMaxRank, plain and fused-swiglu input, row-strided views and an up row slice
// (the qkv split), without writing outside its output; and the plan-invariance property with
// LoRAs on int8, fp8 and mixed models on the GPU (tests/lora_side_cases.h). Skips without a GPU.
#include <unistd.h>

#include <filesystem>

#include "cuda_test_util.h"
#include "lora_side_cases.h"

using namespace ls;
using namespace ls::cudatest;

namespace {

void one_case(Gpu* G, uint64_t seed, int64_t M, int64_t K, int64_t R, int64_t N, bool swiglu) {
  SCOPED_TRACE("seed " + std::to_string(seed) + ": M " + std::to_string(M) + " K " + std::to_string(K) + " R " +
               std::to_string(R) + " N " + std::to_string(N) + (swiglu ? " swiglu" : ""));
  Arena::Scope scope(*G->arena);
  const int64_t xK = swiglu ? 2 * K : K, n0 = static_cast<int64_t>(seed % 3);
  const HostBuf x = random_buf(DType::bf16, {M, xK}, static_cast<uint32_t>(seed), 1.0f);
  const HostBuf out0 = random_buf(DType::bf16, {M, N}, static_cast<uint32_t>(seed + 1), 1.0f);
  const HostBuf down = random_buf(DType::f32, {K, R}, static_cast<uint32_t>(seed + 2), 0.05f);
  const HostBuf up = random_buf(DType::f32, {N + n0 + 1, R}, static_cast<uint32_t>(seed + 3), 0.05f);
  LinearOptions opts;
  opts.swiglu_input = swiglu;
  // CPU reference.
  HostBuf ref = out0;
  ls::LoraSide hs;
  hs.down = down.v;
  hs.up = up.v.slice_rows(n0, n0 + N);
  ASSERT_TRUE(G->cpu->lora_side(x.v, hs, ref.v, opts).ok());
  ASSERT_FALSE(same_bytes(ref, out0)) << "the side path changed nothing";
  // GPU: x and out row-strided inside sentinel guards; down contiguous; up a row slice.
  DevBuf dx = dev_from(G, x), dout = dev_from(G, out0);
  auto dd = G->arena->alloc(DType::f32, {K, R}, "down");
  auto du = G->arena->alloc(DType::f32, {N + n0 + 1, R}, "up");
  ASSERT_TRUE(dd.ok() && du.ok());
  upload_to(G, *dd, down);
  upload_to(G, *du, up);
  ls::LoraSide ds;
  ds.down = *dd;
  ds.up = du->slice_rows(n0, n0 + N);
  ASSERT_TRUE(G->cuda->lora_side(dx.v, ds, dout.v, opts).ok());
  const HostBuf got = download(G, dout.v);
  EXPECT_TRUE(same_bytes(got, ref)) << "CUDA lora_side differs from the CPU reference";
  expect_guards(G, dout, "lora_side out");
  // Row independence on the GPU too: rows [0, a) and [a, M) in two calls.
  if (M > 1) {
    DevBuf d2 = dev_from(G, out0);
    const int64_t a = M / 3 + 1;
    ASSERT_TRUE(G->cuda->lora_side(dx.v.slice_rows(0, a), ds, d2.v.slice_rows(0, a), opts).ok());
    ASSERT_TRUE(G->cuda->lora_side(dx.v.slice_rows(a, M), ds, d2.v.slice_rows(a, M), opts).ok());
    EXPECT_TRUE(same_bytes(download(G, d2.v), ref)) << "split at row " << a;
  }
}

bool have_gpu() { return make_backend("cuda").ok(); }

}  // namespace

TEST(CudaLoraSide, MatchesCpuReferenceByteForByte) {
  LS_NEED_GPU();
  std::mt19937_64 rng(5);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t ranks[] = {1, 3, 16, 31, 64, 128, 200, kLoraSideMaxRank};
  for (uint64_t seed = 1; seed <= 16; ++seed)
    one_case(G, seed, pick(1, 100), pick(1, 400), ranks[seed % 8], pick(1, 300), seed % 2 == 0);
  // Real widths: qkv K = 5376 at rank 64; fc2's fused input K = 14336 at rank 256.
  one_case(G, 101, 257, 5376, 64, 700, false);
  one_case(G, 102, 70, 14336, kLoraSideMaxRank, 300, true);
}

TEST(CudaLoraSide, RefusesRankAboveTheLimit) {
  LS_NEED_GPU();
  Arena::Scope scope(*G->arena);
  auto x = G->arena->alloc(DType::bf16, {2, 8}, "x");
  auto o = G->arena->alloc(DType::bf16, {2, 4}, "o");
  auto d = G->arena->alloc(DType::f32, {8, kLoraSideMaxRank + 1}, "d");
  auto u = G->arena->alloc(DType::f32, {4, kLoraSideMaxRank + 1}, "u");
  ASSERT_TRUE(x.ok() && o.ok() && d.ok() && u.ok());
  ls::LoraSide s;
  s.down = *d;
  s.up = *u;
  const Status st = G->cuda->lora_side(*x, s, *o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::invalid_argument);
}

namespace {
class CudaLoraSideModel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("ls_lora_side_cuda_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  std::filesystem::path dir_;
};
}  // namespace

TEST_F(CudaLoraSideModel, KnobsAndBudgetsMatchResidentStock) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using ls::test::quant::Kind;
  using namespace ls::test::lora_side;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    LoraSetup su = lora_setup(seed, Kind::int8, 2, "cuda", path(std::to_string(seed) + "i"), LoraSpec{});
    ASSERT_TRUE(su.ok);
    check_lora_knobs(su, seed, 8);
  }
  {
    LoraSetup su = lora_setup(5, Kind::fp8, 2, "cuda", path("f5"), LoraSpec{});
    ASSERT_TRUE(su.ok);
    check_lora_knobs(su, 5, 8);
  }
  {
    LoraSpec spec;
    spec.blocks = {0, 2};
    LoraSetup su = lora_setup(10, Kind::mixed, 3, "cuda", path("m10"), spec);
    ASSERT_TRUE(su.ok);
    check_lora_knobs(su, 10, 8);
    check_lora_budgets(su, 6);
  }
}
