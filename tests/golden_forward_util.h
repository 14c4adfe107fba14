// What the whole-forward golden tests share (test_golden_forward.cpp, the bf16 model on
// every backend; test_quant_golden.cpp, the quantised files): host copies of the views
// the engine reports, a golden file's tensors by name, the conditioning every case
// records in its "case" metadata, and the sliced-plan check.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/conditioning.h"
#include "model/h3/config.h"
#include "reference/golden_compare.h"

namespace ls::golden {

// Host copy (float64) of a 1-4-D view with a possibly strided outer dimension.
inline std::vector<double> host_f64(const TensorView& t) {
  std::vector<double> out;
  out.reserve(static_cast<size_t>(t.numel()));
  const int64_t rows = t.ndim == 0 ? 1 : t.size(0);
  const int64_t inner = rows == 0 ? 0 : t.numel() / rows;
  for (int64_t r = 0; r < rows; ++r) {
    // Inner dims contiguous within a row (true for every view the engine reports).
    const void* row = t.ndim == 0 ? t.data : t.at(r);
    for (int64_t i = 0; i < inner; ++i) out.push_back(load_as_f64(row, t.dtype, i));
  }
  return out;
}

// A golden tensor by name (aborts, naming it, when the file lacks it), and its values as
// floats.
inline TensorView view_of(const SafetensorsReader& g, const std::string& n) {
  const SafetensorsEntry* e = g.find(n);
  LS_CHECK_MSG(e != nullptr, "golden lacks " + n);
  return g.view(*e);
}
inline std::vector<float> floats(const SafetensorsReader& g, const std::string& n) {
  std::vector<double> d = to_f64(view_of(g, n));
  return std::vector<float>(d.begin(), d.end());
}

// The clip geometry and the scalar settings of a case (augmentations, shifts, audio
// scale, the seed when recorded) from its "case" metadata.
inline Expected<h3::Conditioning> case_conditioning(const nlohmann::json& cj) {
  h3::Conditioning cond;
  auto geo = h3::clip_geometry(cj["frames"], cj["width"], cj["height"], cj["L"]);
  if (!geo.ok()) return geo.error();
  cond.geometry = *geo;
  cond.vis_aug = cj["vis_aug"];
  cond.aud_aug = cj["aud_aug"];
  cond.shift_video = cj["shift_v"];
  cond.shift_audio = cj["shift_a"];
  cond.audio_scale = cj["audio_scale"];
  if (cj.contains("seed")) cond.seed = cj["seed"].get<uint64_t>();
  return cond;
}

// A sliced plan (two-pass attention in 7-row query slices, the MLP in 13-row and the head
// in 5-row slices: awkward sizes) gives the bytes of the stock plan's output `stock` on
// the golden inputs too (DESIGN.md §1). forward(plan): the case's forward under `plan`.
template <typename Forward>
void expect_sliced_plan_same(const h3::H3Config& cfg, const h3::Conditioning& cond, const exec::ForwardResult& stock,
                             const Forward& forward) {
  exec::PlanKnobs knobs;
  knobs.attn_chunk_tokens = 7;
  knobs.mlp_chunk_tokens = 13;
  knobs.final_chunk_tokens = 5;
  auto plan = exec::make_plan(cfg, cond, knobs);
  ASSERT_TRUE(plan.ok()) << plan.error().message;
  Expected<exec::ForwardResult> sliced = forward(*plan);
  ASSERT_TRUE(sliced.ok()) << sliced.error().message;
  ASSERT_EQ(sliced->video.size(), stock.video.size());
  ASSERT_EQ(sliced->audio.size(), stock.audio.size());
  EXPECT_EQ(0, std::memcmp(sliced->video.data(), stock.video.data(), stock.video.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(sliced->audio.data(), stock.audio.data(), stock.audio.size() * sizeof(float)));
}

}  // namespace ls::golden
