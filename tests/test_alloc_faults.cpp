// Allocation-failure injection (core/alloc_fault.h, issue 11): every allocation a small
// run makes (host arenas, "pinned" host memory and "device" memory, which on the CPU
// backend all come from host_memory_resource()) is failed in turn, k = 1, 2, ...:
// each failure must come back as a clean ErrorCode::out_of_memory with a message (never
// an abort), give back every block taken before it (live_allocations(): ASan cannot see
// mmap'd blocks; under ASan the heap is checked too), and once k exceeds the
// allocations the run makes, the run succeeds with the bytes of the unarmed run.
// The runs: Engine::create + refine_text + precompute_adaln + forward with a sliced plan
// (weights resident; weights streamed through one or two slots with K/V and residual
// offload), and a 2-step sample::generate with CFG. A second test does the same through
// the CLI binary with LAYERSTREAM_TEST_FAIL_ALLOC=k: exit 1, a message, no output file.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/alloc_fault.h"
#include "core/arena.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "sample/generate.h"
#include "sample/schedule.h"

using namespace ls;

namespace {

struct Outcome {
  Status status;
  std::vector<float> video, audio;
};

// A tiny-preset clip: 5 frames at 64x64, 6 text tokens (S 30 rows).
struct Clip {
  h3::H3Config cfg;
  h3::Conditioning cond;
  std::vector<float> text, negative, video, audio;
};

Clip make_setup() {
  Clip s;
  auto c = h3::h3_preset("tiny");
  LS_CHECK(c.ok());
  s.cfg = *c;
  const int64_t L = 6;
  auto g = h3::clip_geometry(5, 64, 64, L);
  LS_CHECK(g.ok());
  s.cond.geometry = *g;
  s.cond.seed = 9;
  s.text = sample::standin_text_states(21, 0, L, s.cfg.text_dim);
  s.negative = sample::standin_text_states(21, 1, 4, s.cfg.text_dim);
  const auto& G = s.cond.geometry;
  s.video.resize(static_cast<size_t>(s.cfg.latents_dim * G.T * G.Hl * G.Wl));
  s.audio.resize(static_cast<size_t>(s.cfg.audio_latents_dim * 2 * G.A));
  for (size_t i = 0; i < s.video.size(); ++i) s.video[i] = static_cast<float>((i * 37) % 101) / 50.0f - 1.0f;
  for (size_t i = 0; i < s.audio.size(); ++i) s.audio[i] = static_cast<float>((i * 53) % 89) / 44.0f - 1.0f;
  return s;
}

struct ForwardCase {
  const char* name;
  exec::Residency residency;
  exec::PlanKnobs knobs;
};

// One engine run from nothing: every object (source, backend, engine) is made and
// destroyed inside, so a failure anywhere must unwind everything it took.
Outcome run_forward(const Clip& s, const ForwardCase& fc) {
  Outcome o;
  h3::H3SyntheticSource src(s.cfg, 3);
  std::unique_ptr<Backend> be = make_cpu_backend();
  {  // a plan's kv_tile is the backend's (Engine::forward refuses another)
    Numerics n = be->numerics();
    n.kv_tile = fc.knobs.kv_tile;
    if (Status k = be->set_numerics(n, be->diagnostics()); !k.ok()) return {k, {}, {}};
  }
  exec::EngineOptions eo;
  eo.residency = fc.residency;
  auto e = exec::Engine::create(src, *be, eo);
  if (!e.ok()) return {e.status(), {}, {}};
  const TensorView text(const_cast<float*>(s.text.data()), DType::f32,
                        {static_cast<int64_t>(s.text.size()) / s.cfg.text_dim, s.cfg.text_dim});
  auto t = (*e)->refine_text(text);
  if (!t.ok()) return {t.status(), {}, {}};
  const float sigma = 0.75f;
  Status st = (*e)->precompute_adaln({1.0f, sigma, 0.5f}, s.cond);
  if (!st.ok()) return {st, {}, {}};
  auto plan = exec::make_plan(s.cfg, s.cond, fc.knobs);
  if (!plan.ok()) return {plan.status(), {}, {}};
  const auto& G = s.cond.geometry;
  const TensorView video(const_cast<float*>(s.video.data()), DType::f32,
                         {s.cfg.latents_dim, G.T, G.Hl, G.Wl});
  const TensorView audio(const_cast<float*>(s.audio.data()), DType::f32, {s.cfg.audio_latents_dim, 2, G.A});
  auto r = (*e)->forward(s.cond, *t, video, audio, sigma, *plan);
  if (!r.ok()) return {r.status(), {}, {}};
  o.video = std::move(r->video);
  o.audio = std::move(r->audio);
  return o;
}

Outcome run_generate(const Clip& s) {
  Outcome o;
  h3::H3SyntheticSource src(s.cfg, 4);
  std::unique_ptr<Backend> be = make_cpu_backend();
  auto e = exec::Engine::create(src, *be);
  if (!e.ok()) return {e.status(), {}, {}};
  sample::GenerateRequest req;
  req.cond = s.cond;
  req.text = TensorView(const_cast<float*>(s.text.data()), DType::f32,
                        {static_cast<int64_t>(s.text.size()) / s.cfg.text_dim, s.cfg.text_dim});
  req.negative = TensorView(const_cast<float*>(s.negative.data()), DType::f32,
                            {static_cast<int64_t>(s.negative.size()) / s.cfg.text_dim, s.cfg.text_dim});
  auto sched = sample::make_simple_schedule(2);
  if (!sched.ok()) return {sched.status(), {}, {}};
  req.sigmas = sched->video;
  req.cfg = 3.0;
  req.seed = 5;
  req.knobs.attn_chunk_tokens = 11;
  req.knobs.mlp_chunk_tokens = 7;
  req.knobs.final_chunk_tokens = 5;
  auto r = sample::generate(**e, req);
  if (!r.ok()) return {r.status(), {}, {}};
  o.video = std::move(r->video);
  o.audio = std::move(r->audio);
  return o;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The walk: the unarmed run counts N allocations; k = 1..N must each fail cleanly (and
// the fault must actually have fired: allocations_seen() >= k), k = N + 1 must succeed
// with the unarmed bytes.
void walk_faults(const std::string& what, const std::function<Outcome()>& run, int64_t min_allocations) {
  SCOPED_TRACE(what);
  const int64_t live0 = ls::testing::live_allocations();
  ls::testing::arm_allocation_fault(0);
  const Outcome ref = run();
  const int64_t n = ls::testing::allocations_seen();
  ASSERT_TRUE(ref.status.ok()) << ref.status.message();
  ASSERT_FALSE(ref.video.empty());
  ASSERT_EQ(ls::testing::live_allocations(), live0) << "the unarmed run kept blocks after its objects were destroyed";
  ASSERT_GE(n, min_allocations) << "the run makes fewer allocations than expected: the walk would prove little";
  std::printf("[ alloc    ] %s: %lld allocations, each failed in turn\n", what.c_str(), static_cast<long long>(n));
  for (int64_t k = 1; k <= n + 1; ++k) {
    ls::testing::arm_allocation_fault(k);
    const Outcome got = run();
    const int64_t seen = ls::testing::allocations_seen();
    ls::testing::arm_allocation_fault(0);
    EXPECT_EQ(ls::testing::live_allocations(), live0) << "k " << k << ": blocks leaked after the failure";
    if (k <= n) {
      ASSERT_GE(seen, k) << "k " << k << ": the run made fewer allocations than the unarmed one";
      ASSERT_FALSE(got.status.ok()) << "k " << k << ": allocation " << k << " failed but the run succeeded";
      EXPECT_EQ(got.status.error().code, ErrorCode::out_of_memory)
          << "k " << k << ": " << to_string(got.status.error().code) << ": " << got.status.message();
      EXPECT_NE(got.status.message().find("memory"), std::string::npos) << "k " << k << ": " << got.status.message();
    } else {
      ASSERT_TRUE(got.status.ok()) << "k " << k << " (past the run's " << n << " allocations): "
                                   << got.status.message();
      EXPECT_TRUE(same(got.video, ref.video)) << "video differs from the unarmed run";
      EXPECT_TRUE(same(got.audio, ref.audio)) << "audio differs from the unarmed run";
    }
  }
}

TEST(AllocFaults, HookCountsAndFailsTheKthHostAllocation) {
  MemoryResource& res = host_memory_resource();
  const int64_t live0 = ls::testing::live_allocations();
  ls::testing::arm_allocation_fault(2);
  auto a = res.allocate(4096);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(ls::testing::live_allocations(), live0 + 1);
  auto b = res.allocate(4096);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code, ErrorCode::out_of_memory);
  EXPECT_NE(b.error().message.find("injected"), std::string::npos) << b.error().message;
  auto z = res.allocate(0);  // a zero-size request takes nothing and is not counted
  ASSERT_TRUE(z.ok());
  auto c = res.allocate(4096);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(ls::testing::allocations_seen(), 3);
  res.deallocate(*a, 4096);
  res.deallocate(*c, 4096);
  EXPECT_EQ(ls::testing::live_allocations(), live0);
  // Arena::create fails the same way through the resource.
  ls::testing::arm_allocation_fault(1);
  auto arena = Arena::create(res, 1 << 20);
  ASSERT_FALSE(arena.ok());
  EXPECT_EQ(arena.error().code, ErrorCode::out_of_memory);
  ls::testing::arm_allocation_fault(0);
  EXPECT_EQ(ls::testing::live_allocations(), live0);
}

TEST(AllocFaults, EveryAllocationOfAForwardFailsCleanly) {
  const Clip s = make_setup();
  exec::PlanKnobs sliced;
  sliced.attn_chunk_tokens = 7;
  sliced.mlp_chunk_tokens = 5;
  sliced.final_chunk_tokens = 3;
  sliced.kv_tile = 4;
  exec::PlanKnobs offload = sliced;
  offload.kv_offload = true;
  offload.residual_offload = true;
  offload.kv_chunk_rows = 8;
  exec::Residency resident, streamed2, streamed1;
  streamed2.resident_blocks = 0;
  streamed2.slots = 2;
  streamed1.resident_blocks = 1;
  streamed1.slots = 1;
  const ForwardCase cases[] = {
      {"resident weights, sliced plan", resident, sliced},
      {"streamed weights (2 slots), K/V + residual offload", streamed2, offload},
      {"1 resident block + 1 slot, K/V offload", streamed1, [&] {
         exec::PlanKnobs k = sliced;
         k.kv_offload = true;
         return k;
       }()},
  };
  // Resident CPU weights take no arena; the rest take weights, slots, pinned copies.
  const int64_t min_allocs[] = {3, 6, 5};
  for (size_t i = 0; i < std::size(cases); ++i)
    walk_faults(cases[i].name, [&] { return run_forward(s, cases[i]); }, min_allocs[i]);
}

TEST(AllocFaults, EveryAllocationOfATwoStepGenerateFailsCleanly) {
  const Clip s = make_setup();
  walk_faults("2-step generate, cfg 3, sliced", [&] { return run_generate(s); }, 4);
}

// ---- the CLI ---------------------------------------------------------------------

struct CliResult {
  int code = -1;
  std::string err;
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CliResult run_cli(const std::string& dir, const std::string& args, int64_t fail_at) {
  const std::string err = dir + "/stderr.txt";
  std::string cmd;
  if (fail_at > 0) cmd = "LAYERSTREAM_TEST_FAIL_ALLOC=" + std::to_string(fail_at) + " ";
  cmd += std::string(LS_TOOL_PATH) + " " + args + " > /dev/null 2> '" + err + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = slurp(err);
  return r;
}

bool exists(const std::string& p) { return access(p.c_str(), F_OK) == 0; }

// k = 1, 2, ... through each command until it succeeds: every failing run exits 1 with
// a message on stderr and leaves neither the output file nor the JSON report.
TEST(AllocFaults, CliExitsOneWithNoOutputFile) {
  char tmpl[] = "/tmp/ls_alloc_faults_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string out = dir + "/out.safetensors", json = dir + "/run.json";
  const std::string files = " -o '" + out + "' --json '" + json + "'";
  const std::string commands[] = {
      "generate --preset tiny --steps 2 --frames 5 --width 64 --height 64 --text-tokens 6 --attn-chunk 11 "
      "--mlp-chunk 7 -q" + files,
      "forward --preset tiny --frames 5 --width 64 --height 64 --text-tokens 6 --sigma 0.5 --attn-chunk 7 "
      "--kv-offload --residual-offload --resident-blocks 0 --slots 2" + files,
  };
  for (const std::string& args : commands) {
    SCOPED_TRACE(args);
    std::remove(out.c_str());
    std::remove(json.c_str());
    const CliResult ok = run_cli(dir, args, 0);
    ASSERT_EQ(ok.code, 0) << ok.err;
    ASSERT_TRUE(exists(out));
    const std::string ref = slurp(out);
    std::remove(out.c_str());
    std::remove(json.c_str());
    const CliResult first = run_cli(dir, args, 1);
    ASSERT_NE(first.code, 0) << "the CLI ignored LAYERSTREAM_TEST_FAIL_ALLOC=1 (cli/main.cpp maps it onto "
                                "ls::testing::arm_allocation_fault)";
    int64_t k = 1;
    for (;; ++k) {
      ASSERT_LE(k, 500) << "no success after 500 injected failures";
      const CliResult r = k == 1 ? first : run_cli(dir, args, k);
      if (r.code == 0) break;
      EXPECT_EQ(r.code, 1) << "k " << k << ": " << r.err;
      EXPECT_NE(r.err.find("memory"), std::string::npos) << "k " << k << ": " << r.err;
      EXPECT_FALSE(exists(out)) << "k " << k << ": an output file was left behind";
      EXPECT_FALSE(exists(json)) << "k " << k << ": a JSON report was left behind";
      std::remove(out.c_str());
      std::remove(json.c_str());
    }
    EXPECT_GT(k, 3) << "the command made almost no allocations";
    ASSERT_TRUE(exists(out));
    EXPECT_EQ(slurp(out), ref) << "the output after the walk differs from the unarmed run's";
  }
  const std::string rm = "rm -rf '" + dir + "'";
  ASSERT_EQ(std::system(rm.c_str()), 0);
}

}  // namespace
