// AdaLN precompute (h3-model.md §2.5-2.6): the modulation tables computed once for every
// timestep of a whole schedule hold, row for row, the bytes the per-step computation
// gives (memcmp), for the unpruned and the curve form; afterwards forward() uses them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>

#include "exactness_util.h"
#include "model/h3/layout.h"

using namespace ls;

namespace {

struct Captured {
  std::map<int64_t, std::vector<uint8_t>> blocks;  // layer -> table bytes [3M, 6D]
  std::vector<uint8_t> final_table;                // [M, 2D]
  int64_t row_bytes_block = 0, row_bytes_final = 0;
};

std::vector<uint8_t> bytes_of(const TensorView& v) {
  const auto* p = static_cast<const uint8_t*>(v.data);
  return std::vector<uint8_t>(p, p + v.nbytes());
}

void check(bool curve, uint64_t seed) {
  std::mt19937_64 rng(seed);
  h3::H3Config cfg = test::tiny_cfg(rng, true);
  if (curve && !cfg.curve_form()) cfg = h3::h3_curve_form(cfg, 17, 4);
  if (!curve && cfg.curve_form()) {
    cfg.adaln_curve_grid = 0;
    cfg.time_embed_dim = 16;
  }
  h3::H3SyntheticSource src(cfg, seed);
  auto be = make_cpu_backend();
  Captured cap;
  exec::EngineOptions opts;
  opts.eval = [&](const std::string& name, int64_t layer, const TensorView& t) {
    if (name == "adaln.block") cap.blocks[layer] = bytes_of(t), cap.row_bytes_block = t.shape[1] * t.elem_size();
    if (name == "adaln.final") cap.final_table = bytes_of(t), cap.row_bytes_final = t.shape[1] * t.elem_size();
  };
  auto eng = exec::Engine::create(src, *be, opts);
  ASSERT_TRUE(eng.ok());
  auto cond = test::random_cond(rng, cfg, true);
  auto in = test::random_inputs(rng, cfg, cond);
  auto text = (*eng)->refine_text(in.text_view(cfg, cond));
  ASSERT_TRUE(text.ok());
  auto plan = exec::make_plan(cfg, cond, {});
  ASSERT_TRUE(plan.ok());
  auto lay = h3::build_layout(cfg, cond, false);
  ASSERT_TRUE(lay.ok());

  const std::vector<float> schedule = {1.0f, 0.983684f, 0.960058f, 0.923077f, 0.85751f, 0.70638f, 0.0f};
  std::vector<Captured> per_step;
  std::vector<std::vector<double>> per_step_t;
  for (float s : schedule) {
    if (s == 0.0f) continue;
    cap = Captured{};
    auto r = (*eng)->forward(cond, *text, in.video_view(cfg, cond), in.audio_view(cfg, cond), s, *plan);
    ASSERT_TRUE(r.ok()) << r.error().message;
    ASSERT_FALSE(r->report.adaln_precomputed);
    per_step.push_back(cap);
    per_step_t.push_back(h3::distinct_timesteps(*lay, cond, s));
  }
  cap = Captured{};
  ASSERT_TRUE((*eng)->precompute_adaln(schedule, cond).ok());
  const Captured pre = cap;
  std::vector<double> all;
  for (const auto& t : per_step_t) all.insert(all.end(), t.begin(), t.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  ASSERT_EQ(pre.final_table.size(), all.size() * static_cast<size_t>(pre.row_bytes_final));
  bool nonzero = false;
  for (uint8_t b : pre.final_table) nonzero = nonzero || b != 0;
  ASSERT_TRUE(nonzero);
  for (size_t k = 0; k < per_step.size(); ++k) {
    for (size_t j = 0; j < per_step_t[k].size(); ++j) {
      const size_t g = static_cast<size_t>(std::lower_bound(all.begin(), all.end(), per_step_t[k][j]) - all.begin());
      ASSERT_LT(g, all.size());
      ASSERT_EQ(all[g], per_step_t[k][j]);
      for (const auto& [layer, tab] : per_step[k].blocks) {
        // Three rows (video, text, audio modality) per timestep.
        const size_t rb = 3 * static_cast<size_t>(pre.row_bytes_block);
        EXPECT_EQ(0, std::memcmp(tab.data() + j * rb, pre.blocks.at(layer).data() + g * rb, rb))
            << "block " << layer << ", t " << all[g];
      }
      const size_t fb = static_cast<size_t>(pre.row_bytes_final);
      EXPECT_EQ(0, std::memcmp(per_step[k].final_table.data() + j * fb, pre.final_table.data() + g * fb, fb));
    }
  }
  // Forward now reads the precomputed tables (no AdaLN weight touched, no tables made).
  cap = Captured{};
  auto r = (*eng)->forward(cond, *text, in.video_view(cfg, cond), in.audio_view(cfg, cond), schedule[2], *plan);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->report.adaln_precomputed);
  EXPECT_TRUE(cap.blocks.empty());
}

}  // namespace

TEST(ExecAdaln, PrecomputeEqualsPerStepUnpruned) {
  for (uint64_t seed : {1u, 2u, 3u}) check(false, seed);
}

TEST(ExecAdaln, PrecomputeEqualsPerStepCurve) {
  for (uint64_t seed : {4u, 5u, 6u}) check(true, seed);
}
