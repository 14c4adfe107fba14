// Plan invariance at real H3 width on the GPU (DESIGN.md §1; issue 4 "done means"):
// one full-width DiT block (hidden 5376, 56 heads x 128, SwiGLU 14336) plus the text
// refiner, embeddings and output heads, synthetic weights, a packed sequence of
// S = 8197 rows (17 text, 80 audio, 8100 video: an 8192-row slice leaves a last slice of
// 5 rows, and kv_tile 8192 a last key tile of 5). Slices of 1, 97, 4096 and 8192 rows
// (attention, MLP and final head alike), and the plans the budget planner makes at its
// minimum and half-way budgets (weights streamed), and K/V plus residual offload, must give
// the bytes of the stock all-resident run (memcmp), on each attention path the build
// has: the cuDNN path (the default where built) with the device's kv_tile, and the
// native kernel with kv_tile 1024; and, on the default path, the same with every input
// mode (masks, keyframe and references at augmentation 0.5, PDD bank). Skips without a GPU. Takes a minute or two on an
// H200 (the 1-row plan runs 8197 one-row slices per phase).
#include "streaming_cases.h"

using namespace ls;

namespace {

bool have_gpu() { return make_backend("cuda").ok(); }

// modes: every input mode beyond t2va (partial masks, a keyframe with audio and two
// references at augmentation 0.5, a PDD bank of 4 on both heads; add_all_modes).
test::StreamingCase real_width_case(bool modes = false) {
  std::mt19937_64 rng(4242);
  test::StreamingCase c;
  auto cfg = h3::h3_preset("h3");
  EXPECT_TRUE(cfg.ok());
  c.cfg = *cfg;
  c.cfg.num_layers = 1;
  if (modes) c.cfg.pdd_heads = 4;
  c.src = std::make_unique<h3::H3SyntheticSource>(c.cfg, 7);
  c.cond = test::random_cond(rng, c.cfg, /*extras=*/false);
  c.cond.geometry.T = 4;
  c.cond.geometry.Hl = 90;
  c.cond.geometry.Wl = 90;
  c.cond.geometry.A = 40;
  c.cond.geometry.text_tokens = 17;
  if (modes) test::add_all_modes(rng, c.cfg, c.cond);
  c.in = test::random_inputs(rng, c.cfg, c.cond);
  c.sigma = 0.8f;
  return c;
}

// Slices of each of `slices` rows for attention, MLP and head alike give ref's bytes.
void check_slices(test::StreamingCase& c, Backend& be, const exec::PlanKnobs& sk, const test::StreamingRun& ref,
                  std::initializer_list<int64_t> slices) {
  for (int64_t slice : slices) {
    exec::PlanKnobs k = sk;
    k.attn_chunk_tokens = k.mlp_chunk_tokens = k.final_chunk_tokens = slice;
    auto p = exec::make_plan(c.cfg, c.cond, k);
    ASSERT_TRUE(p.ok()) << p.error().message;
    test::expect_same(ref, test::run_streaming(c, be, exec::Residency{}, *p), p->describe());
  }
}

// K/V and residual offload by hand (the planner keeps this short sequence's K/V on the
// device): attention slices of 4096, MLP and head of 97, chunks of whole kv_tiles streamed
// back (the last one short), weights through one slot (no prefetch). Gives ref's bytes.
test::StreamingRun check_offload(test::StreamingCase& c, Backend& be, const exec::PlanKnobs& sk,
                                 const test::StreamingRun& ref) {
  exec::PlanKnobs k = sk;
  k.attn_chunk_tokens = 4096;
  k.mlp_chunk_tokens = k.final_chunk_tokens = 97;
  k.kv_offload = k.residual_offload = true;
  auto p = exec::make_plan(c.cfg, c.cond, k);
  EXPECT_TRUE(p.ok()) << p.error().message;
  if (!p.ok()) return {};
  exec::Residency res;
  res.resident_blocks = 0;
  res.slots = 1;
  test::StreamingRun got = test::run_streaming(c, be, res, *p);
  test::expect_same(ref, got, p->describe());
  return got;
}

// The input modes at real width on the default attention path: slices of 97 and 8192
// rows and K/V + residual offload with streamed weights give the stock bytes.
void check_modes() {
  auto be = make_backend("cuda");
  ASSERT_TRUE(be.ok()) << be.error().message;
  test::StreamingCase c = real_width_case(/*modes=*/true);
  c.kv_tile = (*be)->default_kv_tile();
  exec::PlanKnobs sk;
  sk.kv_tile = c.kv_tile;
  auto stock = exec::make_plan(c.cfg, c.cond, sk);
  ASSERT_TRUE(stock.ok()) << stock.error().message;
  const test::StreamingRun ref = test::run_streaming(c, **be, exec::Residency{}, *stock);
  ASSERT_TRUE(ref.ok);
  ASSERT_GT(test::sum_abs(ref.r.video), 0.0);
  check_slices(c, **be, sk, ref, {97, 8192});
  check_offload(c, **be, sk, ref);
}

// The backend with attention `path` ("native" | "cudnn"), set as numerics.
Expected<std::unique_ptr<Backend>> cuda_with(const char* path) {
  Numerics n;
  n.attention = parse_attention(path).value();
  return make_backend("cuda", n, {});
}

void check_path(const char* path) {
  SCOPED_TRACE(std::string("attention path ") + path);
  auto be = cuda_with(path);
  ASSERT_TRUE(be.ok()) << be.error().message;
  ASSERT_EQ(to_string((*be)->numerics().attention), std::string(path));
  test::StreamingCase c = real_width_case();
  c.kv_tile = (*be)->default_kv_tile();
  auto sizes = exec::sequence_sizes(c.cfg, c.cond);
  ASSERT_TRUE(sizes.ok()) << sizes.error().message;
  ASSERT_EQ(sizes->S, 8197);

  exec::PlanKnobs sk;
  sk.kv_tile = c.kv_tile;
  auto stock = exec::make_plan(c.cfg, c.cond, sk);
  ASSERT_TRUE(stock.ok()) << stock.error().message;
  ASSERT_TRUE(stock->stock());
  const test::StreamingRun ref = test::run_streaming(c, **be, exec::Residency{}, *stock);
  ASSERT_TRUE(ref.ok);
  ASSERT_GT(test::sum_abs(ref.r.video), 0.0);
  ASSERT_GT(test::sum_abs(ref.r.audio), 0.0);

  check_slices(c, **be, sk, ref, {1, 97, 4096, 8192});
  {
    const test::StreamingRun got = check_offload(c, **be, sk, ref);
    if (got.ok) {
      EXPECT_GT(got.r.report.pcie_kv_bytes, 0u);
    }
  }

  // The budget planner's choices: at its minimum and half-way.
  const exec::BudgetOptions bo = test::budget_options(c, **be);
  const std::optional<test::BudgetSpan> span = test::budget_span(c, bo);
  ASSERT_TRUE(span.has_value());
  std::set<std::string> steps;
  for (uint64_t budget : {span->lo, span->lo + (span->hi - span->lo) / 2}) {
    const std::optional<exec::BudgetPlan> bp = test::check_budget_run(c, **be, ref, bo, budget);
    ASSERT_TRUE(bp.has_value());
    steps.insert(bp->step);
    std::printf("  budget %.3f GiB: %s\n", static_cast<double>(budget) / (1ull << 30), bp->describe().c_str());
  }
  EXPECT_EQ(steps.size(), 2u) << "the two budgets should give two different plans";
}

bool cudnn_in_build() {
  // Without cuDNN in the build set_numerics refuses attention cudnn; with it the resolved
  // default kv_tile is the cuDNN path's 8192.
  auto be = cuda_with("cudnn");
  return be.ok() && (*be)->default_kv_tile() == 8192;
}

}  // namespace

TEST(CudaRealWidth, SlicesAndBudgetPlansMatchStockNative) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_path("native");
}

TEST(CudaRealWidth, SlicesAndBudgetPlansMatchStockCudnn) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  if (!cudnn_in_build()) GTEST_SKIP() << "this build has no cuDNN";
  check_path("cudnn");
}

TEST(CudaRealWidth, InputModesSlicesAndOffloadMatchStock) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  check_modes();
}

// The Hopper kernel (numerics attention hopper; auto's choice at head dim 128 on sm_90): skips where the
// build or the device cannot run it (set_numerics says why).
TEST(CudaRealWidth, SlicesAndBudgetPlansMatchStockHopper) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto be = cuda_with("hopper");
  if (!be.ok()) GTEST_SKIP() << be.error().message;
  check_path("hopper");
}
