// LoRAs on int8 / fp8 models: the side path (issue 17; backend.h Backend::lora_side,
// model/lora_source.h). The op against its scalar reference and row by row; its refusals;
// the side factors the LoRA source makes; the plan-invariance property with LoRAs on int8,
// fp8 and mixed models (every residency, slicing, offload, budget; memcmp); a whole model
// against a backend whose side path is the scalar reference; malformed cases refused.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "file_test_util.h"
#include "forwarding_backend.h"
#include "lora_side_cases.h"

using namespace ls;
using namespace ls::test::lora_side;
using ls::test::quant::Kind;

namespace {

// Wrapping cfg's synthetic model (seed) with the LoRA files (each at strength 1; the side
// path for quantised targets unless !side_path) is refused: its message ("" and a failure
// when it is accepted).
std::string wrap_refusal(const h3::H3Config& cfg, uint64_t seed, const std::vector<std::string>& paths,
                         bool side_path = true) {
  auto inner = std::make_unique<h3::H3SyntheticSource>(cfg, seed);
  std::vector<lora::LoraFile> files;
  for (const auto& p : paths) files.push_back({p, 1.0});
  auto set = lora::LoraSet::open(files, inner->specs());
  if (!set.ok()) {
    ADD_FAILURE() << set.error().message;
    return "";
  }
  auto s = lora::LoraSource::wrap(std::move(inner), std::move(*set), lora::MergeDtype::f32, side_path);
  if (s.ok()) {
    ADD_FAILURE() << "the LoRA was accepted";
    return "";
  }
  return s.error().message;
}

bool has(const std::string& msg, const std::string& what) { return msg.find(what) != std::string::npos; }

// Two LoRAs (at paths a and b, seeds 1 and 2) of rank `rank` on `linear` of block `block`
// alone: summed, a rank above kLoraSideMaxRank when 2 rank > 256.
void write_two_loras(const h3::H3Config& cfg, int64_t block, const std::string& linear, int64_t rank,
                     const std::string& a, const std::string& b) {
  LoraSpec spec;
  spec.blocks = {block};
  spec.linears = {linear};
  spec.rank_lo = spec.rank_hi = rank;
  write_lora(a, cfg, spec, 1);
  write_lora(b, cfg, spec, 2);
}

// A LoRA file (at `path`) of one full-rank patch "<layer>.diff" (0.01 everywhere) of a
// quantised weight: wrapping cfg's synthetic model (seed) with it is refused, naming it.
void expect_full_rank_patch_refused(const h3::H3Config& cfg, uint64_t seed, const std::string& layer,
                                    const std::string& path) {
  const std::vector<h3::TensorSpec> specs = h3::h3_tensor_specs(cfg);
  const h3::TensorSpec* w = nullptr;
  for (const auto& t : specs)
    if (t.name == layer + ".weight") w = &t;
  ASSERT_NE(w, nullptr) << layer;
  ASSERT_NO_FATAL_FAILURE(test::write_tensors(
      path, test::NamedTensors{
                {layer + ".diff", {DType::f32, w->shape, std::vector<float>(static_cast<size_t>(w->numel()), 0.01f)}}}));
  const std::string m = wrap_refusal(cfg, seed, {path});
  EXPECT_TRUE(has(m, "full-rank patch of " + layer + ".weight")) << m;
}

std::vector<uint16_t> random_bf16(std::mt19937_64& rng, size_t n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<uint16_t> v(n);
  for (auto& h : v) h = f32_to_bf16(nd(rng));
  return v;
}
std::vector<float> random_f32(std::mt19937_64& rng, size_t n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& f : v) f = nd(rng);
  return v;
}

// One random op case: x [M, xK] (xK = 2K with swiglu), down [K, R], up [Nall, R] (a row slice
// [n0, n0 + N) is used), out [M, N] with a row stride > N.
struct OpCase {
  int64_t M, K, R, N, Nall, n0, os;
  bool swiglu;
  std::vector<uint16_t> x, out0;
  std::vector<float> down, up;
  int64_t xK() const { return swiglu ? 2 * K : K; }
};
OpCase op_case(uint64_t seed, int64_t R) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  OpCase c{};
  c.M = pick(1, 70);
  c.K = pick(1, 300);
  c.R = R;
  c.N = pick(1, 150);
  c.n0 = pick(0, 5);
  c.Nall = c.N + c.n0 + pick(0, 3);
  c.os = c.N + pick(0, 4);
  c.swiglu = pick(0, 1) == 1;
  c.x = random_bf16(rng, static_cast<size_t>(c.M * c.xK()), 1.0f);
  c.out0 = random_bf16(rng, static_cast<size_t>(c.M * c.os), 1.0f);
  c.down = random_f32(rng, static_cast<size_t>(c.K * c.R), 0.2f);
  c.up = random_f32(rng, static_cast<size_t>(c.Nall * c.R), 0.2f);
  return c;
}

// Rows [a, b) of the case through be.lora_side into out (the whole [M, os] buffer).
Status run_rows(Backend& be, const OpCase& c, int64_t a, int64_t b, std::vector<uint16_t>& out) {
  TensorView x(const_cast<uint16_t*>(c.x.data()), DType::bf16, {c.M, c.xK()});
  TensorView o = TensorView(out.data(), DType::bf16, {c.M, c.os}).cols(0, c.N);
  LoraSide side;
  side.down = TensorView(const_cast<float*>(c.down.data()), DType::f32, {c.K, c.R});
  side.up = TensorView(const_cast<float*>(c.up.data()), DType::f32, {c.Nall, c.R}).slice_rows(c.n0, c.n0 + c.N);
  LinearOptions opts;
  opts.swiglu_input = c.swiglu;
  return be.lora_side(x.slice_rows(a, b), side, o.slice_rows(a, b), opts);
}

}  // namespace

TEST(LoraSideOp, MatchesScalarReferenceRowByRowAndInSlices) {
  auto be = make_cpu_backend();
  int swiglu_cases = 0;
  for (uint64_t seed = 1; seed <= 24; ++seed) {
    const int64_t ranks[] = {1, 2, 7, 16, 33, 64, kLoraSideMaxRank};
    const OpCase c = op_case(seed, ranks[seed % 7]);
    swiglu_cases += c.swiglu;
    SCOPED_TRACE("seed " + std::to_string(seed) + ": M " + std::to_string(c.M) + " K " + std::to_string(c.K) + " R " +
                 std::to_string(c.R) + " N " + std::to_string(c.N) + (c.swiglu ? " swiglu" : ""));
    std::vector<uint16_t> ref = c.out0;
    lora_side_reference(c.x.data(), c.xK(), c.M, c.swiglu, c.down.data(), c.K, c.R, c.up.data() + c.n0 * c.R, c.R,
                        c.N, ref.data(), c.os);
    ASSERT_NE(std::memcmp(ref.data(), c.out0.data(), ref.size() * 2), 0);  // the side path changed something
    std::vector<uint16_t> all = c.out0;
    ASSERT_TRUE(run_rows(*be, c, 0, c.M, all).ok());
    EXPECT_EQ(std::memcmp(all.data(), ref.data(), ref.size() * 2), 0) << "all rows vs the scalar reference";
    std::vector<uint16_t> one = c.out0;
    for (int64_t m = 0; m < c.M; ++m) ASSERT_TRUE(run_rows(*be, c, m, m + 1, one).ok());
    EXPECT_EQ(std::memcmp(one.data(), ref.data(), ref.size() * 2), 0) << "row by row";
    std::vector<uint16_t> sl = c.out0;
    std::mt19937_64 rng(seed);
    for (int64_t a = 0; a < c.M;) {
      const int64_t b = std::min(c.M, a + std::uniform_int_distribution<int64_t>(1, 20)(rng));
      ASSERT_TRUE(run_rows(*be, c, a, b, sl).ok());
      a = b;
    }
    EXPECT_EQ(std::memcmp(sl.data(), ref.data(), ref.size() * 2), 0) << "random slices";
  }
  EXPECT_GT(swiglu_cases, 0);
  EXPECT_LT(swiglu_cases, 24);
}

TEST(LoraSideOp, RefusesBadArgumentsClearly) {
  auto be = make_cpu_backend();
  std::vector<uint16_t> x(4 * 8), out(4 * 5);
  std::vector<float> down(8 * (kLoraSideMaxRank + 1)), up(5 * (kLoraSideMaxRank + 1));
  LoraSide big;
  big.down = TensorView(down.data(), DType::f32, {8, kLoraSideMaxRank + 1});
  big.up = TensorView(up.data(), DType::f32, {5, kLoraSideMaxRank + 1});
  const TensorView xv(x.data(), DType::bf16, {4, 8}), ov(out.data(), DType::bf16, {4, 5});
  Status s = be->lora_side(xv, big, ov);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(s.message().find("rank 257"), std::string::npos) << s.message();
  LoraSide ok;
  ok.down = TensorView(down.data(), DType::f32, {8, 4});
  ok.up = TensorView(up.data(), DType::f32, {5, 4});
  EXPECT_TRUE(be->lora_side(xv, ok, ov).ok());
  LoraSide bf = ok;
  bf.up.dtype = DType::bf16;
  s = be->lora_side(xv, bf, ov);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::unsupported);
  EXPECT_NE(s.message().find("up f32"), std::string::npos) << s.message();
  const TensorView xf(x.data(), DType::f32, {2, 8});
  EXPECT_FALSE(be->lora_side(xf, ok, TensorView(out.data(), DType::bf16, {2, 5})).ok());
}

class LoraSideModel : public test::TempDirTest {
 protected:
  LoraSideModel() : TempDirTest("ls_lora_side") {}
  std::string lora_path(uint64_t seed) const {
    std::string n = std::to_string(seed);
    n += ".safetensors";  // (built in steps: GCC 12 warns falsely on "l" + to_string(n) + ...)
    return file(n);
  }
};

// The side factors as lora_source.h defines them: down^T and fl32(s * up) per patch in
// columns, chained LoRAs concatenated, zero columns up to the largest rank of that linear
// over the blocks, all-zero factors for a block the LoRAs miss; the slot layout stays uniform.
TEST_F(LoraSideModel, FactorsFollowTheLayout) {
  test::StreamingCase c = test::quant::quant_case(3, Kind::int8, 3, false);
  LoraSpec a;
  a.blocks = {0, 2};
  a.linears = {"attn.qkv_proj", "mlp.fc2"};
  LoraSpec b = a;
  b.blocks = {0};
  b.linears = {"attn.qkv_proj"};
  b.alpha = false;
  write_lora(file("a.safetensors"), c.cfg, a, 11);
  write_lora(file("b.safetensors"), c.cfg, b, 12);
  const std::vector<lora::LoraFile> files = {{file("a.safetensors"), 0.7}, {file("b.safetensors"), -1.25}};
  auto src = lora_source(c.cfg, 3, files);
  ASSERT_TRUE(src);
  EXPECT_EQ(src->side_path_layers(), 6u);  // qkv and fc2 of 3 blocks
  EXPECT_EQ(src->merged_tensors(), 0u);
  EXPECT_NE(src->describe().find("LoRA: side path (int8/fp8) on 6 layers"), std::string::npos) << src->describe();
  auto set = lora::LoraSet::open(files, c.src->specs());
  ASSERT_TRUE(set.ok());
  const auto& q0 = set->patches("blocks.0.attn.qkv_proj.weight");
  ASSERT_EQ(q0.size(), 2u);
  const int64_t R = q0[0].rank + q0[1].rank;
  const auto& q2 = set->patches("blocks.2.attn.qkv_proj.weight");
  ASSERT_EQ(q2.size(), 1u);
  EXPECT_EQ(src->cfg().lora_side.at("blocks.0.attn.qkv_proj"), std::max(R, q2[0].rank));
  const int64_t Rq = src->cfg().lora_side.at("blocks.1.attn.qkv_proj");
  for (int64_t blk = 0; blk < 3; ++blk) {
    const std::string m = h3::h3_block_key(blk, "attn.qkv_proj");
    const TensorView d = src->get(m + ".lora_side_down"), u = src->get(m + ".lora_side_up");
    ASSERT_EQ(d.size(1), Rq);
    ASSERT_EQ(u.size(1), Rq);
    const auto& ps = set->patches(m + ".weight");
    std::vector<float> want_d(static_cast<size_t>(d.numel()), 0.0f), want_u(static_cast<size_t>(u.numel()), 0.0f);
    int64_t off = 0;
    for (const lora::Patch& p : ps) {
      const float sp = static_cast<float>(p.strength * p.alpha_over_rank);
      for (int64_t r = 0; r < p.rank; ++r) {
        for (int64_t k = 0; k < p.in; ++k) want_d[static_cast<size_t>(k * Rq + off + r)] = p.down[static_cast<size_t>(r * p.in + k)];
        for (int64_t n = 0; n < p.out; ++n)
          want_u[static_cast<size_t>(n * Rq + off + r)] = sp * p.up[static_cast<size_t>(n * p.rank + r)];
      }
      off += p.rank;
    }
    EXPECT_EQ(std::memcmp(d.data, want_d.data(), want_d.size() * 4), 0) << m;
    EXPECT_EQ(std::memcmp(u.data, want_u.data(), want_u.size() * 4), 0) << m;
    if (blk == 1) {
      EXPECT_TRUE(ps.empty());  // block 1: no patch, all-zero factors
    }
  }
  // The side tensors are block tensors of their block (they stream in its slot).
  const h3::TensorSpec* s = src->spec("blocks.2.mlp.fc2.lora_side_up");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->role, h3::TensorRole::block);
  EXPECT_EQ(s->block, 2);
  // The declared table of the LoRA source's config is the source's own (the planner's count).
  const std::vector<h3::TensorSpec> declared = h3::h3_tensor_specs(src->cfg());
  ASSERT_EQ(declared.size(), src->specs().size());
  for (size_t i = 0; i < declared.size(); ++i) EXPECT_EQ(declared[i].name, src->specs()[i].name);
}

TEST_F(LoraSideModel, Int8KnobsMatchResidentStock) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    LoraSetup su = lora_setup(seed, Kind::int8, 2, "cpu", lora_path(seed), LoraSpec{});
    ASSERT_TRUE(su.ok);
    EXPECT_NE(su.src->describe().find("side path"), std::string::npos);
    check_lora_knobs(su, seed, 8);
  }
}

TEST_F(LoraSideModel, Fp8KnobsMatchResidentStock) {
  for (uint64_t seed = 5; seed <= 6; ++seed) {
    LoraSetup su = lora_setup(seed, Kind::fp8, 2, "cpu", lora_path(seed), LoraSpec{});
    ASSERT_TRUE(su.ok);
    check_lora_knobs(su, seed, 8);
  }
}

// Mixed formats: fc1 is bf16 (merged), qkv / fc2 int8 and out_proj fp8 (side paths); a LoRA
// on only some blocks (the others get zero factors of the same rank).
TEST_F(LoraSideModel, MixedKnobsAndBudgetsMatchResidentStock) {
  LoraSpec spec;
  spec.blocks = {0, 2};
  LoraSetup su = lora_setup(10, Kind::mixed, 3, "cpu", file("mixed"), spec);
  ASSERT_TRUE(su.ok);
  EXPECT_EQ(su.src->merged_tensors(), 2u);     // fc1 of blocks 0 and 2
  EXPECT_EQ(su.src->side_path_layers(), 9u);   // qkv, out_proj, fc2 of 3 blocks
  EXPECT_NE(su.src->describe().find("LoRA: merged in f32; LoRA: side path (int8/fp8) on 9 layers"), std::string::npos)
      << su.src->describe();
  check_lora_knobs(su, 10, 8);
  check_lora_budgets(su, 6);
}

TEST_F(LoraSideModel, Int8BudgetSweepMatchesAndFits) {
  LoraSetup su = lora_setup(21, Kind::int8, 3, "cpu", file("b21"), LoraSpec{});
  ASSERT_TRUE(su.ok);
  check_lora_budgets(su, 8);
}

// Each linear's side path reaches the output (every call site applies it: qkv in the fused and
// the row-split K/V/Q forms, out_proj, fc1, the fused-swiglu int8 fc2), across slicings.
TEST_F(LoraSideModel, EveryLinearsSidePathReachesTheOutput) {
  for (const std::string& l : block_linears()) {
    LoraSpec spec;
    spec.linears = {l};
    LoraSetup su = lora_setup(31, Kind::int8, 2, "cpu", file(l), spec);  // lora_setup: differs from no LoRA
    ASSERT_TRUE(su.ok) << l;
    check_lora_knobs(su, 31, 3);
  }
}

namespace {
// The CPU backend with the side path replaced by the scalar reference (every other op
// forwarded): the engine's result must not change by a bit.
class ScalarSideBackend final : public test::ForwardingBackend {
 public:
  ScalarSideBackend() : ForwardingBackend(make_cpu_backend()) {}
  int calls = 0;
  std::string name() const override { return "scalar-side(" + in_->name() + ")"; }
  Status lora_side(const TensorView& x, const ls::LoraSide& s, const TensorView& o, const LinearOptions& opts) override {
    ++calls;
    LS_TRY(check_lora_side_args("scalar", x, s, o, opts));
    const int64_t K = s.down.size(0), R = s.down.size(1), N = s.up.size(0);
    lora_side_reference(x.ptr<const uint16_t>(), x.stride[0], x.size(0), opts.swiglu_input, s.down.ptr<const float>(),
                        K, R, s.up.ptr<const float>(), s.up.stride[0], N, o.ptr<uint16_t>(), o.stride[0]);
    return Status();
  }
};
}  // namespace

TEST_F(LoraSideModel, ModelMatchesScalarReferenceSidePath) {
  for (Kind kind : {Kind::int8, Kind::fp8}) {
    LoraSetup su = lora_setup(kind == Kind::int8 ? 41 : 42, kind, 2, "cpu", file("s"), LoraSpec{});
    ASSERT_TRUE(su.ok);
    ScalarSideBackend scalar;
    ASSERT_TRUE(test::use_kv_tile(scalar, su.c.kv_tile).ok());
    exec::PlanKnobs k;
    k.kv_tile = su.c.kv_tile;
    k.attn_chunk_tokens = 3;  // the row-split qkv path too
    k.mlp_chunk_tokens = 5;
    auto p = exec::make_plan(su.c.cfg, su.c.cond, k);
    ASSERT_TRUE(p.ok());
    const test::StreamingRun got = test::quant::run_on(*su.src, su.c, scalar, exec::Residency{}, *p);
    test::expect_same(su.ref, got, test::quant::kind_name(kind));
    EXPECT_GT(scalar.calls, 0);
  }
}

TEST_F(LoraSideModel, MalformedCasesAreRefusedByName) {
  test::StreamingCase c = test::quant::quant_case(7, Kind::int8, 2, false);
  // Rank above kLoraSideMaxRank on one layer (two LoRAs of rank 130 summed).
  write_two_loras(c.cfg, 1, "mlp.fc1", 130, file("big1"), file("big2"));
  const std::string m = wrap_refusal(c.cfg, 7, {file("big1"), file("big2")});
  EXPECT_TRUE(has(m, "blocks.N.mlp.fc1 (quantised) add up to rank 260")) << m;
  // merge-lora (no side path) refuses a quantised target, naming it.
  const std::string mm = wrap_refusal(c.cfg, 7, {file("big1")}, /*side_path=*/false);
  EXPECT_TRUE(has(mm, "blocks.1.mlp.fc1.weight, stored as i8")) << mm;
  EXPECT_TRUE(has(mm, "--lora")) << mm;
  // A full-rank .diff on a quantised weight.
  expect_full_rank_patch_refused(c.cfg, 7, "blocks.0.attn.out_proj", file("diff"));
  // A full-rank patch on a quantised AdaLN linear (the int8-full files) is refused like one
  // on a block linear; rank above the limit on one AdaLN linear too.
  {
    test::StreamingCase f = test::quant::quant_case(9, Kind::int8_full, 2, false);
    expect_full_rank_patch_refused(f.cfg, 9, "blocks.1.adaln_proj.linear", file("adiff"));
    write_two_loras(f.cfg, 0, "adaln_proj.linear", 200, file("abig1"), file("abig2"));
    const std::string ma = wrap_refusal(f.cfg, 9, {file("abig1"), file("abig2")});
    EXPECT_TRUE(has(ma, "blocks.0.adaln_proj.linear (quantised) add up to rank 400")) << ma;
  }
}

// LoRAs on the int8-full files' quantised AdaLN linears (blocks.N.adaln_proj.linear): the
// side path runs where the AdaLN tables are computed. Side factors only for the patched
// blocks, with the AdaLN role (the precompute's transient copies, counted by the planner);
// the tables equal the scalar reference; every plan and budget keeps the bytes.
TEST_F(LoraSideModel, AdalnSidePathOnInt8FullFiles) {
  LoraSpec spec;
  spec.blocks = {1};
  spec.linears = {"adaln_proj.linear"};
  LoraSetup su = lora_setup(51, Kind::int8_full, 2, "cpu", file("adaln"), spec);  // differs from no LoRA
  ASSERT_TRUE(su.ok);
  const h3::H3Config& cfg = su.src->cfg();
  ASSERT_EQ(cfg.lora_side.size(), 1u);
  ASSERT_EQ(cfg.lora_side.count("blocks.1.adaln_proj.linear"), 1u);
  const h3::TensorSpec* d = su.src->spec("blocks.1.adaln_proj.linear.lora_side_down");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->role, h3::TensorRole::adaln);
  EXPECT_EQ(d->block, 1);
  EXPECT_EQ(su.src->spec("blocks.0.adaln_proj.linear.lora_side_down"), nullptr);
  check_lora_knobs(su, 51, 6);
  check_lora_budgets(su, 6, 1);
  // The engine's side path on the AdaLN against the scalar reference.
  ScalarSideBackend scalar;
  ASSERT_TRUE(test::use_kv_tile(scalar, su.c.kv_tile).ok());
  const test::StreamingRun got = test::quant::run_on(*su.src, su.c, scalar, exec::Residency{}, su.stock);
  test::expect_same(su.ref, got, "scalar side path");
  EXPECT_GE(scalar.calls, 1) << "the AdaLN linear took no side path";
  // With the blocks' linears patched too (the AdaLN and block side paths together).
  LoraSpec both;
  both.linears = {"adaln_proj.linear", "attn.qkv_proj", "mlp.fc2"};
  LoraSetup sb = lora_setup(52, Kind::int8_full, 2, "cpu", file("both"), both);
  ASSERT_TRUE(sb.ok);
  check_lora_knobs(sb, 52, 4);
}
