// Sequence parallel over NCCL (docs/multi-gpu.md): N GPUs give exactly one GPU's output
// bytes (memcmp), for N = 2, 4, 8 as far as the machine has GPUs, under the stock plan,
// sliced plans (down to one-row MLP slices) and weight streaming. Skips with fewer than
// two CUDA devices or without NCCL in the build.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/backend.h"
#include "backend/comm.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "model/h3/torch_random.h"

using namespace ls;

namespace {

int cuda_devices() {
  int n = 0;
  while (n < 8 && make_backend("cuda:" + std::to_string(n)).ok()) ++n;
  return n;
}

// The small preset with 8 heads of 128 (so 2, 4 and 8 ranks divide them).
h3::H3Config cfg8() {
  auto c = h3::h3_preset("small");
  EXPECT_TRUE(c.ok());
  c->heads = 8;
  return *c;
}

h3::Conditioning clip() {
  h3::Conditioning c;
  auto g = h3::clip_geometry(9, 128, 96, 21);  // S a few hundred rows, not a multiple of 8
  EXPECT_TRUE(g.ok());
  c.geometry = *g;
  c.seed = 3;
  return c;
}

struct Outcome {
  std::vector<float> video, audio;
  int64_t ranks = 0;
};

Outcome run(const h3::H3TensorSource& src, int n, const Numerics& nm, const exec::PlanKnobs& knobs_in,
        const exec::Residency& res = {}) {
  const h3::H3Config& cfg = src.cfg();
  std::vector<std::unique_ptr<Backend>> be;
  for (int i = 0; i < n; ++i) {
    auto b = make_backend("cuda:" + std::to_string(i), nm, {});
    EXPECT_TRUE(b.ok());
    be.push_back(std::move(*b));
  }
  exec::EngineOptions o;
  o.residency = res;
  for (int i = 1; i < n; ++i) o.peer_backends.push_back(be[static_cast<size_t>(i)].get());
  auto e = exec::Engine::create(src, *be[0], o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
  if (!e.ok()) return {};
  const h3::Conditioning cond = clip();
  const h3::ClipGeometry& g = cond.geometry;
  std::vector<float> video = h3::torch_cpu_randn(1, cfg.latents_dim * g.T * g.Hl * g.Wl);
  std::vector<float> audio = h3::torch_cpu_randn(2, cfg.audio_latents_dim * 2 * g.A);
  std::vector<float> text = h3::torch_cpu_randn(3, g.text_tokens * cfg.text_dim);
  auto t = (*e)->refine_text(TensorView(text.data(), DType::f32, {g.text_tokens, cfg.text_dim}));
  EXPECT_TRUE(t.ok());
  exec::PlanKnobs k = knobs_in;
  k.kv_tile = be[0]->default_kv_tile();
  k.ranks = n;
  auto p = exec::make_plan(cfg, cond, k);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  if (!p.ok() || !t.ok()) return {};
  auto r = (*e)->forward(cond, *t, TensorView(video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl}),
                         TensorView(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A}), 0.8f, *p);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  if (!r.ok()) return {};
  std::printf("%d GPU(s): %s\n", n, r->report.status_line().c_str());
  return Outcome{r->video, r->audio, r->report.ranks};
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST(UlyssesNccl, GpusGiveOneGpusBytes) {
  const int gpus = cuda_devices();
  if (gpus < 2) GTEST_SKIP() << "needs two CUDA devices (found " << gpus << ")";
  std::vector<Backend*> probe_be;
  auto b0 = make_backend("cuda:0");
  auto b1 = make_backend("cuda:1");
  ASSERT_TRUE(b0.ok() && b1.ok());
  probe_be = {b0->get(), b1->get()};
  auto probe = make_communicator_group(probe_be);
  if (!probe.ok() && probe.error().code == ErrorCode::unsupported) GTEST_SKIP() << probe.error().message;
  ASSERT_TRUE(probe.ok()) << probe.error().message;
  probe->clear();

  const h3::H3SyntheticSource src(cfg8(), 7);
  // The native attention kernel is one thread block per (query tile, head): exact by
  // construction. cuDNN builds one graph per head count (H / N on each rank), so this
  // also checks that its heuristic picks an engine whose bits do not depend on H.
  for (const char* att : {"native", "auto"}) {
  Numerics nm;
  if (std::string(att) == "native") nm.attention = AttentionAlgorithm::native;
  SCOPED_TRACE(std::string("attention ") + att);
  const Outcome ref = run(src, 1, nm, {});
  ASSERT_FALSE(ref.video.empty());
  for (int n : {2, 4, 8}) {
    if (n > gpus) break;
    SCOPED_TRACE(std::to_string(n) + " GPUs");
    const Outcome stock = run(src, n, nm, {});
    EXPECT_EQ(stock.ranks, n);
    EXPECT_TRUE(same(ref.video, stock.video)) << "video differs";
    EXPECT_TRUE(same(ref.audio, stock.audio)) << "audio differs";
    exec::PlanKnobs sliced;
    sliced.attn_chunk_tokens = 37;
    sliced.mlp_chunk_tokens = 1;
    sliced.final_chunk_tokens = 19;
    exec::Residency streamed;
    streamed.resident_blocks = 1;
    streamed.slots = 2;
    const Outcome s = run(src, n, nm, sliced, streamed);
    EXPECT_TRUE(same(ref.video, s.video)) << "video differs (sliced, streamed)";
    EXPECT_TRUE(same(ref.audio, s.audio)) << "audio differs (sliced, streamed)";
  }
  }
}
