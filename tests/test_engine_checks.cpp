// The engine's run-time checks and observers (EngineOptions): the non-finite check
// names the first block and phase where a NaN appeared (and is off with
// check_finite = false), the progress callback reports every block, and the memory
// samples cover every phase. None of them changes an output bit (memcmp).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "exactness_util.h"
#include "forwarding_backend.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/checkpoint.h"

namespace ls::test {
namespace {

// A synthetic source with one tensor replaced by a copy holding a NaN (or inf) at one element.
class PoisonedSource final : public h3::H3TensorSource {
 public:
  PoisonedSource(const h3::H3TensorSource& base, std::string name, float value) : base_(base), name_(std::move(name)) {
    set_specs(base.specs());
    const TensorView t = base.get(name_);
    const auto bytes = static_cast<size_t>(t.nbytes());
    copy_.assign(bytes, 0);
    std::memcpy(copy_.data(), t.data, bytes);
    const size_t mid = static_cast<size_t>(t.numel() / 2);
    if (t.dtype == DType::bf16) {
      reinterpret_cast<uint16_t*>(copy_.data())[mid] = f32_to_bf16(value);
    } else {
      EXPECT_EQ(t.dtype, DType::f32);
      reinterpret_cast<float*>(copy_.data())[mid] = value;
    }
    view_ = t;
    view_.data = copy_.data();
  }
  const h3::H3Config& cfg() const override { return base_.cfg(); }
  TensorView get(const std::string& name) const override { return name == name_ ? view_ : base_.get(name); }
  bool has(const std::string& name) const override { return base_.has(name); }
  std::string describe() const override { return base_.describe() + " with a non-finite " + name_; }

 private:
  const h3::H3TensorSource& base_;
  std::string name_;
  std::vector<unsigned char> copy_;
  TensorView view_;
};

using Case = SmallCase;

Case make_case() { return small_case(11, 5); }

struct RunResult {
  Expected<exec::ForwardResult> r = make_error(ErrorCode::not_found, "not run");
  std::vector<std::pair<int64_t, int64_t>> progress;
};

RunResult run(Case& c, const h3::H3TensorSource& src, const exec::PlanKnobs& knobs, exec::EngineOptions opts) {
  RunResult out;
  auto be = make_cpu_backend();
  EXPECT_TRUE(use_kv_tile(*be, knobs.kv_tile).ok());  // the plan's kv_tile is the backend's
  opts.progress = [&](int64_t done, int64_t total) { out.progress.emplace_back(done, total); };
  auto eng = exec::Engine::create(src, *be, opts);
  if (!eng.ok()) {
    out.r = eng.error();
    return out;
  }
  auto text = (*eng)->refine_text(c.in.text_view(c.cfg, c.cond));
  if (!text.ok()) {
    out.r = text.error();
    return out;
  }
  auto plan = exec::make_plan(c.cfg, c.cond, knobs);
  EXPECT_TRUE(plan.ok()) << (plan.ok() ? "" : plan.error().message);
  if (!plan.ok()) return out;
  out.r = (*eng)->forward(c.cond, *text, c.in.video_view(c.cfg, c.cond), c.in.audio_view(c.cfg, c.cond), 0.8f, *plan);
  return out;
}

exec::PlanKnobs sliced(bool offload) {
  exec::PlanKnobs k;
  k.mlp_chunk_tokens = 7;
  k.attn_chunk_tokens = 5;
  k.final_chunk_tokens = 3;
  k.kv_tile = 16;
  k.kv_offload = offload;
  k.residual_offload = offload;
  return k;
}

TEST(EngineChecks, NanInABlockWeightNamesTheFirstBlockAndPhase) {
  Case c = make_case();
  h3::H3SyntheticSource base(c.cfg, 3);
  // A NaN in block 1's fc2 weight reaches the residual in block 1's MLP half, not before.
  const std::string name = "blocks.1.mlp.fc2.weight";
  ASSERT_TRUE(base.has(name));
  PoisonedSource bad(base, name, std::numeric_limits<float>::quiet_NaN());
  for (bool offload : {false, true}) {
    for (const exec::PlanKnobs& k : {exec::PlanKnobs{}, sliced(offload)}) {
      RunResult r = run(c, bad, k, {});
      ASSERT_FALSE(r.r.ok()) << "a NaN weight must fail the call (offload " << offload << ")";
      EXPECT_EQ(r.r.error().code, ErrorCode::nonfinite);
      EXPECT_NE(r.r.error().message.find("block 1 (mlp)"), std::string::npos) << r.r.error().message;
      // Progress stopped at the block that failed: block 0 finished, block 1 did not.
      ASSERT_EQ(r.progress.size(), 1u);
    }
  }
  // check_finite = false: the call succeeds and the output is non-finite.
  exec::EngineOptions off;
  off.check_finite = false;
  RunResult r = run(c, bad, sliced(true), off);
  ASSERT_TRUE(r.r.ok()) << r.r.error().message;
  int64_t nonfinite = 0;
  for (float v : r.r->video) nonfinite += std::isfinite(v) ? 0 : 1;
  EXPECT_GT(nonfinite, 0);
}

TEST(EngineChecks, InfInThePatchProjectionIsNamedAtTheEmbedding) {
  Case c = make_case();
  h3::H3SyntheticSource base(c.cfg, 3);
  PoisonedSource bad(base, "video_patch_proj.weight", std::numeric_limits<float>::infinity());
  RunResult r = run(c, bad, sliced(false), {});
  ASSERT_FALSE(r.r.ok());
  EXPECT_EQ(r.r.error().code, ErrorCode::nonfinite);
  EXPECT_NE(r.r.error().message.find("after embed"), std::string::npos) << r.r.error().message;
  EXPECT_TRUE(r.progress.empty());
}

TEST(EngineChecks, NanInTheHeadIsNamedAtTheFinalLayer) {
  Case c = make_case();
  h3::H3SyntheticSource base(c.cfg, 3);
  PoisonedSource bad(base, "final_layer.video_out.bias", std::numeric_limits<float>::quiet_NaN());
  RunResult r = run(c, bad, {}, {});
  ASSERT_FALSE(r.r.ok());
  EXPECT_EQ(r.r.error().code, ErrorCode::nonfinite);
  EXPECT_NE(r.r.error().message.find("after the final layer"), std::string::npos) << r.r.error().message;
  EXPECT_EQ(r.progress.size(), 3u);
}

TEST(EngineChecks, ChecksProgressAndMemorySamplesKeepEveryBit) {
  Case c = make_case();
  h3::H3SyntheticSource src(c.cfg, 3);
  for (bool offload : {false, true}) {
    exec::EngineOptions plain;
    plain.check_finite = false;
    RunResult ref = run(c, src, sliced(offload), plain);
    ASSERT_TRUE(ref.r.ok()) << ref.r.error().message;
    exec::EngineOptions all;
    all.record_memory = true;
    RunResult r = run(c, src, sliced(offload), all);
    ASSERT_TRUE(r.r.ok()) << r.r.error().message;
    EXPECT_TRUE(same_bytes(ref.r->video, r.r->video));
    EXPECT_TRUE(same_bytes(ref.r->audio, r.r->audio));
    EXPECT_GT(sum_abs(r.r->video), 0.0);
    EXPECT_EQ(r.r->report.measured_peak_bytes, ref.r->report.measured_peak_bytes);
    // Progress: every block once, in order.
    ASSERT_EQ(r.progress.size(), 3u);
    for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(r.progress[static_cast<size_t>(i)], std::make_pair(i + 1, int64_t{3}));
    // Memory: embed, attention and mlp per block, final; peaks within the plan.
    const auto& ms = r.r->report.memory;
    ASSERT_EQ(ms.size(), 1u + 2u * 3u + 1u);
    EXPECT_EQ(ms.front().phase, "embed");
    EXPECT_EQ(ms[1].phase, "attention");
    EXPECT_EQ(ms[1].block, 0);
    EXPECT_EQ(ms[2].phase, "mlp");
    EXPECT_EQ(ms.back().phase, "final");
    uint64_t max_act = 0;
    for (const auto& s : ms) {
      EXPECT_LE(s.activations, r.r->report.predicted_peak_bytes);
      EXPECT_GT(s.activations, 0u);
      EXPECT_GE(s.held, s.activations);
      max_act = std::max(max_act, s.activations);
      if (s.phase == "attention") EXPECT_GT(s.kv, 0u) << "two-pass attention holds K/V buffers";
      else EXPECT_EQ(s.kv, 0u);
    }
    EXPECT_EQ(max_act, r.r->report.measured_peak_bytes);
    EXPECT_TRUE(ref.r->report.memory.empty());
  }
}


// A CPU backend that asks for a workspace (as CUDA does) and records, for every GEMM,
// the workspace it holds at that moment.
class WorkspaceBackend final : public ForwardingBackend {
 public:
  WorkspaceBackend() : ForwardingBackend(make_cpu_backend()) {}
  static constexpr size_t kBytes = 4096;
  const void* ws = nullptr;
  std::vector<const void*> seen;  // ws at each gemm
  size_t workspace_bytes() const override { return kBytes; }
  Status set_workspace(const TensorView& v) override {
    EXPECT_TRUE(v.empty() || static_cast<size_t>(v.nbytes()) >= kBytes);
    ws = v.empty() ? nullptr : v.data;
    return Status();
  }
  Status gemm(const TensorView& x, const TensorView& w, const TensorView* b, const TensorView& o) override {
    seen.push_back(ws);
    return ForwardingBackend::gemm(x, w, b, o);
  }
};

// Two engines on one backend: each op of an engine runs with that engine's own
// workspace (the one bound last is not the one in use), and an engine's destruction
// leaves the backend no view of the arena it freed. The outputs are the same bytes.
TEST(EngineChecks, EnginesSharingABackendEachUseTheirOwnWorkspace) {
  Case c = make_case();
  h3::H3SyntheticSource src(c.cfg, 3);
  WorkspaceBackend be;
  const exec::PlanKnobs k = sliced(false);
  ASSERT_TRUE(use_kv_tile(be, k.kv_tile).ok());
  auto plan = exec::make_plan(c.cfg, c.cond, k);
  ASSERT_TRUE(plan.ok());
  auto a = exec::Engine::create(src, be, {});
  ASSERT_TRUE(a.ok()) << a.error().message;
  const void* wa = be.ws;
  ASSERT_NE(wa, nullptr);
  auto b = exec::Engine::create(src, be, {});
  ASSERT_TRUE(b.ok()) << b.error().message;
  const void* wb = be.ws;
  ASSERT_NE(wb, nullptr);
  EXPECT_NE(wa, wb);
  const auto run_on = [&](exec::Engine& e) {
    be.seen.clear();
    auto text = e.refine_text(c.in.text_view(c.cfg, c.cond));
    EXPECT_TRUE(text.ok());
    auto r = e.forward(c.cond, *text, c.in.video_view(c.cfg, c.cond), c.in.audio_view(c.cfg, c.cond), 0.8f, *plan);
    EXPECT_TRUE(r.ok()) << r.error().message;
    return r.ok() ? r->video : std::vector<float>{};
  };
  const std::vector<float> va = run_on(**a);  // b bound last: a rebinds its own
  ASSERT_FALSE(be.seen.empty());
  for (const void* p : be.seen) EXPECT_EQ(p, wa);
  b->reset();                   // b's arena is freed ...
  EXPECT_EQ(be.ws, nullptr);    // ... and the backend holds no view of it
  const std::vector<float> va2 = run_on(**a);
  for (const void* p : be.seen) EXPECT_EQ(p, wa);
  ASSERT_EQ(va.size(), va2.size());
  EXPECT_EQ(std::memcmp(va.data(), va2.data(), va.size() * sizeof(float)), 0);
  a->reset();
  EXPECT_EQ(be.ws, nullptr);
}

}  // namespace
}  // namespace ls::test
