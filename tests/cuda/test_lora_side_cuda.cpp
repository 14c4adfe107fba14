// The LoRA side path on the GPU (issue 17; backend.h Backend::lora_side): the CUDA kernel
// gives the CPU reference's bytes (memcmp) for random shapes up to the real H3 widths and
// rank kLoraSideMaxRank, plain and fused-swiglu input, row-strided views and an up row slice
// (the qkv split), without writing outside its output; and the plan-invariance property with
// LoRAs on int8, fp8 and mixed models on the GPU (tests/lora_side_cases.h). Skips without a GPU.
#include <unistd.h>

#include <filesystem>

#include "cuda_test_util.h"
#include "lora_side_cases.h"
#include "model/h3/adaln.h"

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

// The AdaLN linear of the int8-full files with a LoRA (h3::adaln_linear = linear_lora: the
// int8 ConvRot linear with its fp32 bias, then the side path) at H3's widths: M timestep rows,
// K = time_embed_dim 2688, N = 18 D = 96768, rank 64 and 256. CUDA gives the CPU's bytes.
TEST(CudaLoraSide, AdalnLinearWithSidePathMatchesCpu) {
  LS_NEED_GPU();
  const int64_t K = 2688, N = 18 * 5376, G64 = 64;
  for (const auto& [M, R] : std::vector<std::pair<int64_t, int64_t>>{{3, 64}, {17, kLoraSideMaxRank}}) {
    SCOPED_TRACE("M " + std::to_string(M) + " R " + std::to_string(R));
    Arena::Scope scope(*G->arena);
    const HostBuf x = random_buf(DType::bf16, {M, K}, 11, 1.0f);
    HostBuf w(DType::i8, {N, K});
    std::mt19937 rng(12);
    std::uniform_int_distribution<int> q(-127, 127);
    for (int64_t i = 0; i < N * K; ++i) reinterpret_cast<int8_t*>(w.bytes.data())[i] = static_cast<int8_t>(q(rng));
    const HostBuf sc = random_buf(DType::f32, {N}, 13, 1e-4f, 2e-4f);
    const HostBuf bias = random_buf(DType::bf16, {N}, 14, 0.1f);
    const HostBuf down = random_buf(DType::f32, {K, R}, 15, 0.02f);
    const HostBuf up = random_buf(DType::f32, {N, R}, 16, 0.02f);
    auto weight = [&](const TensorView& wv, const TensorView& sv, const TensorView& dv, const TensorView& uv) {
      LinearWeight lw(wv);
      lw.format = WeightFormat::int8_convrot;
      lw.scale = sv;
      lw.group = G64;
      lw.lora.down = dv;
      lw.lora.up = uv;
      return lw;
    };
    HostBuf ref(DType::bf16, {M, N}), plain(DType::bf16, {M, N});
    ASSERT_TRUE(h3::adaln_linear(*G->cpu, x.v, weight(w.v, sc.v, down.v, up.v), bias.v, ref.v).ok());
    ASSERT_TRUE(h3::adaln_linear(*G->cpu, x.v, weight(w.v, sc.v, TensorView(), TensorView()), bias.v, plain.v).ok());
    ASSERT_FALSE(same_bytes(ref, plain)) << "the side path changed nothing";
    auto upload = [&](const HostBuf& h, const char* what) {
      auto d = h.v.ndim == 1 ? G->arena->alloc(h.v.dtype, {h.v.shape[0]}, what)
                             : G->arena->alloc(h.v.dtype, {h.v.shape[0], h.v.shape[1]}, what);
      EXPECT_TRUE(d.ok());
      EXPECT_TRUE(G->cuda->copy(*d, h.v).ok());
      return *d;
    };
    const TensorView dx = upload(x, "x"), dw = upload(w, "w"), dsc = upload(sc, "scale"), db = upload(bias, "bias"),
                     dd = upload(down, "down"), du = upload(up, "up");
    auto dout = G->arena->alloc(DType::bf16, {M, N}, "out");
    ASSERT_TRUE(dout.ok());
    ASSERT_TRUE(h3::adaln_linear(*G->cuda, dx, weight(dw, dsc, dd, du), db, *dout).ok());
    ASSERT_TRUE(G->cuda->synchronize().ok());
    const HostBuf got = download(G, *dout);
    EXPECT_TRUE(same_bytes(got, ref)) << "CUDA AdaLN linear + side path differs from the CPU";
  }
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
  {
    // The int8-full files' quantised AdaLN linears with a LoRA (and the blocks' linears).
    LoraSpec spec;
    spec.linears = {"adaln_proj.linear", "attn.qkv_proj"};
    LoraSetup su = lora_setup(12, Kind::int8_full, 2, "cuda", path("a12"), spec);
    ASSERT_TRUE(su.ok);
    check_lora_knobs(su, 12, 6);
    check_lora_budgets(su, 4, 1);
  }
}
