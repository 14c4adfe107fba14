// Issue 26 item 3's drift table: how far the velocities of the whole model move when a
// lossy numerics choice replaces the default one, per sigma. One process, one set of
// synthetic weights per weight form (made once in host memory, the values make-model
// would write; bench_budget's chain: api::Session -> plan -> Engine -> denoise):
//
//   reference  bf16 weights, the backend's default attention (CUDA sm_90: hopper, bf16)
//   int8       bf16 weights, attention int8 (docs/int8-attention.md), its default kv_tile
//   fp8        weights --precision fp8 (bf16 qkv / fc1 / fc2 -> e4m3 at load), default attention
//
// For every sigma of --sigmas, each variant's velocities (video, audio, and both together)
// against the reference: relative L2 = ||v - v_ref|| / ||v_ref||, accumulated in float64;
// also max |v - v_ref| and the output hashes. Memory: all resident when the device holds
// the model (--budget unlimited, the default), else the planner's plan for the budget
// (memory never changes a bit, so the table does not depend on it).
//
// Usage:
//   bench_drift [--preset h3] [--blocks N] [--frames 73 --width 768 --height 512 --text-tokens 256]
//               [--sigmas 0.9,0.5,0.1] [--variants int8,fp8] [--budget unlimited|SIZE] [--device cuda]
//               [--json out.json]
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "api/session.h"
#include "bench_clip.h"
#include "bench_json.h"
#include "model/h3/torch_random.h"

namespace {

using namespace ls;
using bench::Clip;

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "bench_drift: %s\n", m.c_str());
  std::exit(2);
}

struct Args {
  std::string preset = "h3", device = "cuda", json, budget = "unlimited";
  int64_t blocks = 0, frames = 73, width = 768, height = 512, text_tokens = 256;
  std::vector<std::string> sigmas = {"0.9", "0.5", "0.1"};
  std::vector<std::string> variants = {"int8", "fp8"};
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::printf(
          "bench_drift: relative L2 of the velocities of lossy numerics against the default (issue 26)\n"
          "  --preset NAME       tiny | small | h3 (default h3)\n"
          "  --blocks N          fewer blocks at full width (default: the preset's)\n"
          "  --frames/--width/--height/--text-tokens  clip (default 73 768 512 256)\n"
          "  --sigmas LIST       comma list (default 0.9,0.5,0.1)\n"
          "  --variants LIST     int8 (attention int8), fp8 (--precision fp8 weights); default int8,fp8\n"
          "  --budget B          unlimited (default) or a total device budget (3G, 24GiB, ...)\n"
          "  --device D          cuda | cuda:N | cpu (default cuda)\n"
          "  --json FILE         write the results\n");
      std::exit(0);
    }
    if (i + 1 >= argc) die("missing value after " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--preset") a.preset = v;
      else if (k == "--blocks") a.blocks = std::stoll(v);
      else if (k == "--frames") a.frames = std::stoll(v);
      else if (k == "--width") a.width = std::stoll(v);
      else if (k == "--height") a.height = std::stoll(v);
      else if (k == "--text-tokens") a.text_tokens = std::stoll(v);
      else if (k == "--sigmas") a.sigmas = bench::split_commas(v);
      else if (k == "--variants") a.variants = bench::split_commas(v);
      else if (k == "--budget") a.budget = v;
      else if (k == "--device") a.device = v;
      else if (k == "--json") a.json = v;
      else die("unknown option " + k + " (see --help)");
    } catch (const std::exception&) {
      die("bad value '" + v + "' for " + k);
    }
  }
  for (const std::string& v : a.variants)
    if (v != "int8" && v != "fp8") die("unknown variant '" + v + "' (int8 or fp8)");
  return a;
}

struct Run {
  std::vector<float> video, audio;
  std::string hash, numerics, plan;
  double seconds = 0;
};

struct Drift {
  double rel_video, rel_audio, rel_all, max_abs;
};

Drift drift(const Run& ref, const Run& x) {
  auto acc = [](const std::vector<float>& r, const std::vector<float>& v, double& num, double& den, double& mx) {
    if (r.size() != v.size()) die("output sizes differ");
    for (size_t i = 0; i < r.size(); ++i) {
      const double d = static_cast<double>(v[i]) - r[i];
      num += d * d;
      den += static_cast<double>(r[i]) * r[i];
      mx = std::max(mx, std::fabs(d));
    }
  };
  double nv = 0, dv = 0, na = 0, da = 0, mx = 0;
  acc(ref.video, x.video, nv, dv, mx);
  acc(ref.audio, x.audio, na, da, mx);
  return {std::sqrt(nv / dv), std::sqrt(na / da), std::sqrt((nv + na) / (dv + da)), mx};
}

// One engine for the session's weights and backend numerics, one denoiser call per sigma.
// A failure (printed) returns what ran before it; the caller records the variant as failed.
// With `ref`, each sigma's drift against ref is printed as soon as its run ends (a run cut
// short by a time limit keeps the rows it finished).
std::vector<Run> run_sigmas(api::Session& session, const Clip& clip, const Args& a, const std::vector<float>& sigmas,
                            double (*clock)(), const std::vector<Run>* ref = nullptr) {
  const h3::H3Config& cfg = session.config();
  api::MemorySpec memory;
  if (a.budget != "unlimited") {
    auto v = exec::parse_byte_size(a.budget);
    if (!v.ok()) die(v.error().message);
    memory.total_budget = *v;
  } else {
    memory.total_budget = 1ull << 50;
  }
  memory.mode = api::MemoryMode::total_budget;
  memory.knobs.kv_tile = session.resolve_kv_tile(0);  // the backend's numerics now (they change between variants)
  std::printf("  engine at %.1f s\n", clock());
  auto rp = session.plan(clip.cond, sigmas, memory);
  if (!rp.ok()) {
    std::printf("  FAILED: plan: %s\n", rp.error().message.c_str());
    return {};
  }
  exec::EngineOptions eo;
  eo.residency.release_source = false;  // the next engine (another numerics) reuses the host weights
  if (Status st = session.create_engine(*rp, eo); !st.ok()) {
    std::printf("  FAILED: engine: %s\n", st.error().message.c_str());
    return {};
  }
  std::printf("  engine ready at %.1f s\n", clock());
  std::fflush(stdout);
  std::vector<Run> runs;
  for (float sigma : sigmas) {
    api::DenoiseCall call;
    bench::set_inputs(call, clip, cfg);
    call.sigma = sigma;
    call.plan = &rp->plan;
    call.precompute_sigmas = {sigma};
    auto r = session.denoise(call);
    if (!r.ok()) {
      std::printf("  FAILED: denoise at sigma %.2f: %s\n", sigma, r.error().message.c_str());
      break;
    }
    Run run;
    run.hash = bench::hex16(r->hash());
    run.video = std::move(r->video);
    run.audio = std::move(r->audio);
    run.numerics = describe(session.backend().numerics());
    run.plan = rp->budget ? rp->budget->describe() : std::string();
    run.seconds = r->report.wall_seconds;
    std::printf("  sigma %.2f: %s, forward %.3f s, hash %s (at %.1f s)\n", sigma, run.numerics.c_str(), run.seconds,
                run.hash.c_str(), clock());
    if (ref != nullptr && runs.size() < ref->size()) {
      const Drift d = drift((*ref)[runs.size()], run);
      std::printf("  sigma %.2f: rel L2 vs reference: video %.3e audio %.3e both %.3e, max abs %.3e\n", sigma, d.rel_video,
                  d.rel_audio, d.rel_all, d.max_abs);
    }
    std::fflush(stdout);
    runs.push_back(std::move(run));
  }
  session.drop_engine();
  return runs;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::vector<float> sigmas;
  for (const std::string& s : a.sigmas) sigmas.push_back(std::stof(s));
  auto opened = api::Session::open_backend(a.device);
  if (!opened.ok()) die(opened.error().message);
  std::shared_ptr<Backend> backend = (*opened)->shared_backend();
  api::WeightsSpec weights;
  weights.preset = a.preset;
  weights.blocks = a.blocks;
  static const auto t0 = std::chrono::steady_clock::now();
  double (*secs)() = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

  std::unique_ptr<api::Session> session = std::move(*opened);
  if (Status st = session->load_weights(weights); !st.ok()) die(st.error().message);
  const Clip clip = bench::make_clip("bench_drift", session->config(), a.frames, a.width, a.height, a.text_tokens);
  auto sizes = exec::sequence_sizes(session->config(), clip.cond);
  if (!sizes.ok()) die(sizes.error().message);
  const int64_t blocks = session->config().num_layers;
  std::printf("bench_drift: %s, %" PRId64 " blocks, S = %" PRId64 " (%" PRId64 " frames %" PRId64 "x%" PRId64 ", %" PRId64
              " text tokens), budget %s, on %s\n",
              a.preset.c_str(), blocks, sizes->S, a.frames, a.width, a.height, a.text_tokens, a.budget.c_str(),
              backend->name().c_str());
  std::printf("reference (bf16 weights, default attention):\n");
  std::fflush(stdout);
  const Numerics default_numerics = backend->numerics();
  const std::vector<Run> ref = run_sigmas(*session, clip, a, sigmas, secs);
  if (ref.size() != sigmas.size()) die("the reference run failed");
  std::printf("  (%.1f s since start)\n", secs());

  // The table and the JSON are written after every variant, so a run cut short keeps
  // what it measured.
  std::ostringstream head;
  head << "{\"bench\": \"bench_drift\", \"preset\": \"" << a.preset << "\", \"blocks\": " << blocks << ", \"S\": " << sizes->S
       << ", \"frames\": " << a.frames << ", \"width\": " << a.width << ", \"height\": " << a.height
       << ", \"text_tokens\": " << a.text_tokens << ", \"budget\": \"" << a.budget << "\", \"device\": \""
       << bench::json_escape(backend->name()) << "\", \"reference_numerics\": \"" << bench::json_escape(ref[0].numerics)
       << "\", \"reference\": [";
  for (size_t s = 0; s < sigmas.size(); ++s)
    head << (s ? ", " : "") << "{\"sigma\": " << a.sigmas[s] << ", \"hash\": \"" << ref[s].hash
         << "\", \"forward_seconds\": " << ref[s].seconds << "}";
  head << "], \"variants\": [";
  std::string body;
  std::vector<std::string> table;
  auto add = [&](const std::string& name, const std::vector<Run>& runs) {
    if (runs.size() != sigmas.size()) {
      table.push_back(name + " | FAILED (see the log) | | | | |");
      return;
    }
    std::ostringstream js;
    js << (body.empty() ? "" : ", ") << "{\"name\": \"" << name << "\", \"numerics\": \""
       << bench::json_escape(runs[0].numerics) << "\", \"sigmas\": [";
    for (size_t s = 0; s < sigmas.size(); ++s) {
      const Drift d = drift(ref[s], runs[s]);
      char line[256];
      std::snprintf(line, sizeof line, "%s | %s | %.3e | %.3e | %.3e | %.3e | %.3f", name.c_str(), a.sigmas[s].c_str(),
                    d.rel_video, d.rel_audio, d.rel_all, d.max_abs, runs[s].seconds);
      table.push_back(line);
      std::printf("  %s\n", line);
      js << (s ? ", " : "") << "{\"sigma\": " << a.sigmas[s] << ", \"rel_l2_video\": " << d.rel_video
         << ", \"rel_l2_audio\": " << d.rel_audio << ", \"rel_l2_both\": " << d.rel_all << ", \"max_abs\": " << d.max_abs
         << ", \"hash\": \"" << runs[s].hash << "\", \"forward_seconds\": " << runs[s].seconds << "}";
    }
    js << "]}";
    body += js.str();
    std::ostringstream doc;
    doc << head.str() << body << "], \"total_seconds\": " << secs() << "}\n";
    if (!a.json.empty() && !bench::write_json_text(a.json, doc.str())) die("cannot write " + a.json);
    std::fflush(stdout);
  };

  for (const std::string& v : a.variants) {
    if (v != "int8") continue;
    Numerics n;
    n.attention = AttentionAlgorithm::int8;
    std::printf("int8 (bf16 weights, attention int8):\n");
    if (Status st = backend->set_numerics(n, backend->diagnostics()); !st.ok()) {
      std::printf("  FAILED: attention int8: %s\n", st.error().message.c_str());
      add("int8 attention", {});
    } else {
      add("int8 attention", run_sigmas(*session, clip, a, sigmas, secs, &ref));
    }
    std::printf("  (%.1f s since start)\n", secs());
    Numerics back;  // the default again (auto), resolved for the model's head dim
    if (Status st = backend->set_numerics(back, backend->diagnostics()); !st.ok()) die("default numerics: " + st.error().message);
    if (Status st = backend->set_model_head_dim(session->config().head_dim); !st.ok()) die(st.error().message);
  }
  for (const std::string& v : a.variants) {
    if (v != "fp8") continue;
    session.reset();  // frees the bf16 host weights before the fp8 ones are made
    session = api::Session::with_backend(backend);
    api::WeightsSpec w8 = weights;
    w8.precision = "fp8";
    if (Status st = session->load_weights(w8); !st.ok()) die("fp8 weights: " + st.error().message);
    if (describe(backend->numerics()) != describe(default_numerics))
      die("the fp8 run's numerics (" + describe(backend->numerics()) + ") are not the reference's (" +
          describe(default_numerics) + ")");
    std::printf("fp8 (--precision fp8 weights, default attention):\n");
    add("fp8 weights (--precision fp8)", run_sigmas(*session, clip, a, sigmas, secs, &ref));
    std::printf("  (%.1f s since start)\n", secs());
  }

  std::printf("\nrelative L2 of the velocities against the reference (%s), %" PRId64 " blocks, S = %" PRId64 "\n",
              ref[0].numerics.c_str(), blocks, sizes->S);
  std::printf("variant | sigma | video | audio | both | max abs | forward s\n");
  for (const std::string& l : table) std::printf("%s\n", l.c_str());
  std::printf("total %.1f s\n", secs());
  return 0;
}
