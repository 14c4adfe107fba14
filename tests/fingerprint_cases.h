// Pinned output fingerprints (issue 11): fixed synthetic weights and fixed inputs, run
// through the engine (and the sampler), hashed (FNV-1a 64 of the fp32 video then audio
// bytes, ForwardResult::hash), and compared with the values recorded in
// tests/data/fingerprints.json, one section per backend (and attention path).
//
// These hashes are the one check that notices an "equivalent" rewrite that is not: a
// changed reduction order, rounding point, kernel or constant changes them even when
// every exactness test (which compares runs of the same build) still passes.
//
// CHANGING A RECORDED HASH IS A DELIBERATE ACT: only together with an entry in
// docs/numerics.md ("Fingerprint changes") naming the commit, the section, the cases and
// the reason (a numerics fix, a new kernel, a toolchain change: the CPU values depend on
// the C library's expf/sinf/cosf). Never to make a red test green.
//
// Only plain text-to-video+audio clips (no keyframes, references, masks or PDD bank):
// those numerics are still moving. Inputs use no library random-number distribution
// (std::normal_distribution differs between standard libraries).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/hash.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "sample/generate.h"
#include "sample/schedule.h"

namespace ls::test::fingerprint {

struct Case {
  std::string name;       // the key in fingerprints.json
  std::string preset;     // "tiny" | "small"
  bool curve = false;     // the curve AdaLN form (h3_curve_form(cfg, 33, 8))
  float sigma = 1.0f;     // forward: the video sigma
  exec::PlanKnobs knobs;  // kv_tile always set explicitly: the backends' defaults differ
  int steps = 0;          // > 0: sample::generate with this many steps instead of one forward
  double cfg = 1.0;
};

inline exec::PlanKnobs knobs(int64_t kv_tile, int64_t attn = 0, int64_t mlp = 0, int64_t fin = 0) {
  exec::PlanKnobs k;
  k.kv_tile = kv_tile;
  k.attn_chunk_tokens = attn;
  k.mlp_chunk_tokens = mlp;
  k.final_chunk_tokens = fin;
  return k;
}

inline std::vector<Case> cases() {
  return {
      {"tiny t2va sigma 1", "tiny", false, 1.0f, knobs(1024), 0, 1.0},
      {"tiny t2va sigma 0.5", "tiny", false, 0.5f, knobs(1024), 0, 1.0},
      // The same call under a sliced plan: must equal the previous hash (exactness).
      {"tiny t2va sigma 0.5 sliced", "tiny", false, 0.5f, knobs(1024, 7, 5, 3), 0, 1.0},
      {"tiny t2va sigma 0.5 kv_tile 8", "tiny", false, 0.5f, knobs(8), 0, 1.0},
      {"tiny curve form sigma 0.75", "tiny", true, 0.75f, knobs(1024), 0, 1.0},
      {"small t2va sigma 0.8", "small", false, 0.8f, knobs(1024), 0, 1.0},
      {"tiny generate 2 steps cfg 2.5", "tiny", false, 0.0f, knobs(1024, 11, 7, 0), 2, 2.5},
  };
}

// Inputs from integer formulas: exact, the same on every machine.
inline std::vector<float> pattern(size_t n, uint64_t salt) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t h = (static_cast<uint64_t>(i) * 2654435761ull + salt * 40503ull) % 2003ull;
    v[i] = static_cast<float>(static_cast<double>(h) / 1001.0 - 1.0);
  }
  return v;
}

inline std::string hex(uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

// The case's hash on `be`, or the error. The backend's numerics take the case's kv_tile
// for the call (a plan's kv_tile must be the backend's) and get their previous value
// back after it; the refiner's L = 6 keys are one tile at every kv_tile of the cases.
inline Expected<uint64_t> run_case_at_tile(const Case& c, Backend& be);
inline Expected<uint64_t> run_case(const Case& c, Backend& be) {
  const Numerics before = be.numerics();
  Numerics n = before;
  n.kv_tile = c.knobs.kv_tile;
  LS_TRY(be.set_numerics(n, be.diagnostics()));
  Expected<uint64_t> h = run_case_at_tile(c, be);
  LS_TRY(be.set_numerics(before, be.diagnostics()));
  return h;
}
inline Expected<uint64_t> run_case_at_tile(const Case& c, Backend& be) {
  LS_ASSIGN_OR_RETURN(h3::H3Config cfg, h3::h3_preset(c.preset));
  if (c.curve) cfg = h3::h3_curve_form(cfg, 33, 8);
  h3::H3SyntheticSource src(cfg, 7);
  LS_ASSIGN_OR_RETURN(auto engine, exec::Engine::create(src, be));
  const int64_t L = 6;
  LS_ASSIGN_OR_RETURN(h3::ClipGeometry g, h3::clip_geometry(5, 64, 64, L));
  std::vector<float> text = pattern(static_cast<size_t>(L * cfg.text_dim), 1);
  const TensorView text_v(text.data(), DType::f32, {L, cfg.text_dim});
  if (c.steps > 0) {
    std::vector<float> negative = pattern(static_cast<size_t>(4 * cfg.text_dim), 2);
    sample::GenerateRequest req;
    req.cond.geometry = g;
    req.text = text_v;
    req.negative = TensorView(negative.data(), DType::f32, {4, cfg.text_dim});
    LS_ASSIGN_OR_RETURN(auto sched, sample::make_simple_schedule(c.steps));
    req.sigmas = sched.video;
    req.cfg = c.cfg;
    req.seed = 5;
    req.knobs = c.knobs;
    LS_ASSIGN_OR_RETURN(auto r, sample::generate(*engine, req));
    return fnv1a64(r.audio.data(), r.audio.size() * sizeof(float),
                   fnv1a64(r.video.data(), r.video.size() * sizeof(float)));
  }
  h3::Conditioning cond;
  cond.geometry = g;
  cond.seed = 3;
  std::vector<float> video = pattern(static_cast<size_t>(cfg.latents_dim * g.T * g.Hl * g.Wl), 3);
  std::vector<float> audio = pattern(static_cast<size_t>(cfg.audio_latents_dim * 2 * g.A), 4);
  LS_ASSIGN_OR_RETURN(auto refined, engine->refine_text(text_v));
  LS_ASSIGN_OR_RETURN(auto plan, exec::make_plan(cfg, cond, c.knobs));
  LS_ASSIGN_OR_RETURN(auto r, engine->forward(cond, refined,
                                              TensorView(video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl}),
                                              TensorView(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A}),
                                              c.sigma, plan));
  return r.hash();
}

// The recorded hashes of one section of tests/data/fingerprints.json ("" = not recorded).
inline std::map<std::string, std::string> recorded(const std::string& section) {
  const std::string path = std::string(LS_TEST_DATA_DIR) + "/fingerprints.json";
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::map<std::string, std::string> m;
  if (!f.good()) return m;
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << path << " is not valid JSON";
  if (j.is_discarded() || !j.contains(section)) return m;
  for (const auto& [k, v] : j[section].items()) m[k] = v.is_string() ? v.get<std::string>() : std::string();
  return m;
}

// Runs every case on `be` and compares with the section. Prints the observed values as
// a JSON object to paste into fingerprints.json (after a deliberate change only: see
// the top of this file). Fails on any mismatch, and when values are not recorded yet.
inline void check_section(const std::string& section, Backend& be) {
  const auto want = recorded(section);
  std::map<std::string, std::string> got;
  int mismatches = 0, missing = 0;
  for (const Case& c : cases()) {
    auto h = run_case(c, be);
    ASSERT_TRUE(h.ok()) << c.name << ": " << h.error().message;
    got[c.name] = hex(*h);
    auto it = want.find(c.name);
    if (it == want.end() || it->second.empty()) {
      ++missing;
    } else if (it->second != got[c.name]) {
      ++mismatches;
      ADD_FAILURE() << "fingerprint changed: [" << section << "] \"" << c.name << "\" is " << got[c.name]
                    << ", recorded " << it->second;
    }
  }
  EXPECT_EQ(got["tiny t2va sigma 0.5"], got["tiny t2va sigma 0.5 sliced"]) << "a sliced plan changed the bytes";
  EXPECT_NE(got["tiny t2va sigma 0.5"], got["tiny t2va sigma 0.5 kv_tile 8"]) << "kv_tile should change bits";
  std::ostringstream block;
  block << "  \"" << section << "\": {\n";
  size_t i = 0;
  for (const Case& c : cases())
    block << "    \"" << c.name << "\": \"" << got[c.name] << "\"" << (++i < cases().size() ? "," : "") << "\n";
  block << "  }";
  std::printf("observed fingerprints on %s (the \"%s\" section of tests/data/fingerprints.json):\n%s\n",
              be.name().c_str(), section.c_str(), block.str().c_str());
  if (missing > 0)
    ADD_FAILURE() << missing << " fingerprint(s) of section \"" << section
                  << "\" are not recorded yet. To record them (a deliberate act): check the run is the intended "
                     "numerics, paste the block printed above into tests/data/fingerprints.json, and add an entry "
                     "to docs/numerics.md (\"Fingerprint changes\") with the commit and the reason.";
  if (mismatches > 0)
    ADD_FAILURE() << mismatches << " fingerprint(s) of section \"" << section
                  << "\" changed. If the change is intended, record it: replace the values with the block above "
                     "and add an entry to docs/numerics.md (\"Fingerprint changes\") naming the commit, the cases "
                     "and the reason. Otherwise an output bit changed that should not have.";
}

}  // namespace ls::test::fingerprint
