// Issue 16's benchmark: sequence parallel (Ulysses, docs/multi-gpu.md) on 1, 2, 4 (, 8)
// GPUs of one host, ONE denoiser call of the whole H3 model (synthetic weights made once
// in host memory, shared by every engine) at one clip size, per (GPU count, total device
// budget PER GPU). Each configuration builds its engine (ranks on cuda:0 .. cuda:N-1,
// one thread per rank, NCCL between them), refines the text, precomputes the AdaLN
// tables, prepares the arenas, then runs the forward --repeat times (the first also
// builds the cuDNN plans and pins the GEMM algorithms of its shapes: H/N heads); the
// LAST forward's wall time is the one reported. Prints and writes (JSON) per run: the
// forward seconds, the speed-up over one GPU under the same budget, the scaling
// efficiency, each rank's device peak, and the output hash with whether it equals the
// one-GPU output under the same budget (it must: the bytes never depend on N).
//
// Usage (S = 111,274 by default):
//   bench_multi_gpu [--preset h3] [--blocks N] [--frames 362 --width 1024 --height 1024
//                   --text-tokens 500] [--sigma 0.9] [--gpus 1,2,4] [--budgets unlimited,8G]
//                   [--repeat 2] [--json out.json]
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_args.h"
#include "bench_json.h"
#include "core/arena.h"  // format_bytes
#include "exec/engine.h"
#include "exec/planner.h"
#include "model/h3/checkpoint.h"
#include "model/h3/torch_random.h"

namespace {

using namespace ls;

[[noreturn]] void die(const std::string& m) { bench::die("bench_multi_gpu", 2, m); }

struct Args : bench::ModelClipArgs {
  std::string json;
  int64_t repeat = 2;
  std::vector<int> gpus = {1, 2, 4};
  std::vector<std::string> budgets = {"unlimited", "8G"};
};

Args parse(int argc, char** argv) {
  Args a;
  bench::Flags f(
      "bench_multi_gpu",
      std::string("bench_multi_gpu: one denoiser call of the whole model on N GPUs (sequence parallel, issue 16)\n") +
          bench::kModelClipUsage +
          "  --gpus LIST         GPU counts (default 1,2,4; each must divide the heads)\n"
          "  --budgets LIST      total device budgets PER GPU: unlimited, 8G, ... (default unlimited,8G)\n"
          "  --repeat N          forwards per configuration, the last one timed (default 2)\n"
          "  --json FILE         write the results\n",
      2);
  bench::add_model_clip(f, a)
      .with("--repeat", [&](const std::string& v) { a.repeat = std::max<int64_t>(1, std::stoll(v)); })
      .with("--gpus",
            [&](const std::string& v) {
              a.gpus.clear();
              for (const auto& g : bench::split_commas(v)) a.gpus.push_back(std::stoi(g));
            })
      .list("--budgets", a.budgets)
      .text("--json", a.json)
      .parse(argc, argv);
  return a;
}

struct Result {
  double seconds = 0;
  std::string hash;
};

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  auto cfg = h3::h3_preset(a.preset);
  if (!cfg.ok()) die(cfg.error().message);
  if (a.blocks > 0) cfg->num_layers = a.blocks;
  const h3::H3SyntheticSource src(*cfg, 0);  // weights seed 0: what `layerstream forward --preset` uses
  int max_gpus = 0;
  for (int g : a.gpus) max_gpus = std::max(max_gpus, g);
  std::vector<std::unique_ptr<Backend>> be;
  for (int i = 0; i < max_gpus; ++i) {
    auto b = make_backend("cuda:" + std::to_string(i));
    if (!b.ok()) die("cuda:" + std::to_string(i) + ": " + b.error().message);
    be.push_back(std::move(*b));
  }
  auto g = h3::clip_geometry(a.frames, a.width, a.height, a.text_tokens);
  if (!g.ok()) die(g.error().message);
  h3::Conditioning cond;
  cond.geometry = *g;
  // The seeded inputs of `layerstream forward --seed 0` (video, audio, text).
  std::vector<float> video = h3::torch_cpu_randn(0, cfg->latents_dim * g->T * g->Hl * g->Wl);
  std::vector<float> audio = h3::torch_cpu_randn(1, cfg->audio_latents_dim * 2 * g->A);
  std::vector<float> text = h3::torch_cpu_randn(2, g->text_tokens * cfg->text_dim);
  const TensorView vv(video.data(), DType::f32, {cfg->latents_dim, g->T, g->Hl, g->Wl});
  const TensorView av(audio.data(), DType::f32, {cfg->audio_latents_dim, 2, g->A});
  const TensorView tv(text.data(), DType::f32, {g->text_tokens, cfg->text_dim});
  auto sizes = exec::sequence_sizes(*cfg, cond);
  if (!sizes.ok()) die(sizes.error().message);
  std::printf("bench_multi_gpu: %s, %" PRId64 " blocks, S = %" PRId64 ", sigma %.3f, on %s (x%d)\n", a.preset.c_str(),
              cfg->num_layers, sizes->S, a.sigma, be[0]->name().c_str(), max_gpus);
  std::fflush(stdout);

  std::map<std::string, Result> one_gpu;  // budget -> the 1-GPU run (the reference)
  std::ostringstream js;
  js << "{\"bench\": \"bench_multi_gpu\", \"preset\": \"" << a.preset << "\", \"blocks\": " << cfg->num_layers
     << ", \"S\": " << sizes->S << ", \"sigma\": " << a.sigma << ", \"device\": \"" << bench::json_escape(be[0]->name())
     << "\", \"runs\": [";
  bool first_run = true;
  std::vector<std::string> table;
  for (const std::string& b : a.budgets) {
    for (int n : a.gpus) {
      const std::string tag = std::to_string(n) + " GPU(s), " + b;
      js << (first_run ? "" : ", ") << "{\"gpus\": " << n << ", \"budget\": \"" << b << "\"";
      first_run = false;
      exec::PlanRequest q;
      q.cfg = &*cfg;
      q.tensors = &src.specs();
      q.cond = &cond;
      q.sigmas = {a.sigma};
      q.device = exec::device_profile(*be[0]);
      q.knobs.ranks = n;
      if (b != "unlimited") {
        auto bytes = exec::parse_byte_size(b);
        if (!bytes.ok()) die(bytes.error().message);
        q.mode = exec::MemoryMode::total_budget;
        q.budget_bytes = *bytes;
      }
      auto rp = exec::plan_memory(q);
      if (!rp.ok()) {
        std::printf("[%s] refused: %s\n", tag.c_str(), rp.error().message.c_str());
        js << ", \"refused\": \"" << bench::json_escape(rp.error().message) << "\"}";
        continue;
      }
      exec::EngineOptions eo;
      eo.residency.release_source = false;  // the next configuration reuses the host weights
      eo.residency.resident_blocks = rp->residency.resident_blocks;
      eo.residency.slots = rp->residency.slots;
      for (int i = 1; i < n; ++i) eo.peer_backends.push_back(be[static_cast<size_t>(i)].get());
      auto fail = [&](const std::string& what, const Error& e) {
        std::printf("[%s] FAILED (%s): %s\n", tag.c_str(), what.c_str(), e.message.c_str());
        js << ", \"failed\": \"" << bench::json_escape(what + ": " + e.message) << "\"}";
      };
      auto engine = exec::Engine::create(src, *be[0], eo);
      if (!engine.ok()) { fail("create", engine.error()); continue; }
      auto refined = (*engine)->refine_text(tv);
      if (!refined.ok()) { fail("refine", refined.error()); continue; }
      if (Status s = (*engine)->precompute_adaln({a.sigma}, cond); !s.ok()) { fail("precompute", s.error()); continue; }
      if (Status s = (*engine)->prepare(cond, rp->plan); !s.ok()) { fail("prepare", s.error()); continue; }
      Expected<exec::ForwardResult> r = Error{};
      for (int64_t k = 0; k < a.repeat; ++k) {
        r = (*engine)->forward(cond, *refined, vv, av, a.sigma, rp->plan);
        if (!r.ok()) break;
      }
      if (!r.ok()) { fail("forward", r.error()); continue; }
      const exec::RunReport& rep = r->report;
      const Result res{rep.wall_seconds, bench::hex16(r->hash())};
      if (n == 1) one_gpu[b] = res;
      const auto ref = one_gpu.find(b);
      const double speedup = ref != one_gpu.end() && res.seconds > 0 ? ref->second.seconds / res.seconds : 0;
      const bool same = ref != one_gpu.end() && ref->second.hash == res.hash;
      std::printf("[%s] %s\n[%s] forward %.3f s, x%.3f over one GPU (efficiency %.1f %%), hash %s %s\n", tag.c_str(),
                  rep.status_line().c_str(), tag.c_str(), res.seconds, speedup, 100.0 * speedup / n, res.hash.c_str(),
                  ref == one_gpu.end() ? "(no 1-GPU reference)" : same ? "(identical to 1 GPU)" : "(DIFFERS from 1 GPU)");
      std::fflush(stdout);
      js << ", \"plan\": \"" << bench::json_escape(rp->plan.describe()) << "\", \"resident_blocks\": " << rp->residency.resident_blocks
         << ", \"forward_seconds\": " << res.seconds << ", \"speedup_vs_1gpu\": " << speedup
         << ", \"output_hash\": \"" << res.hash << "\", \"identical_to_1gpu\": " << (same ? "true" : "false")
         << ", \"report\": " << rep.to_json() << "}";
      char line[256];
      std::snprintf(line, sizeof line, "%d | %s | %.2f s | x%.3f | %.1f %% | %s | %s", n, b.c_str(), res.seconds, speedup,
                    100.0 * speedup / n, format_bytes(rep.device_peak_bytes).c_str(), same ? "identical" : "DIFFERS");
      table.push_back(line);
      if (!a.json.empty()) {
        std::ostringstream doc;
        doc << js.str() << "], \"complete\": false}\n";
        (void)bench::write_json_text(a.json, doc.str());
      }
    }
  }
  if (!a.json.empty()) {
    std::ostringstream doc;
    doc << js.str() << "], \"complete\": true}\n";
    if (!bench::write_json_text(a.json, doc.str())) die("cannot write " + a.json);
  }
  std::printf("\nGPUs | budget per GPU | forward | speed-up | efficiency | max device peak | vs 1 GPU\n");
  for (const auto& l : table) std::printf("%s\n", l.c_str());
  return 0;
}
