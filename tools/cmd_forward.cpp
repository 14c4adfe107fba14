// `layerstream forward`: ONE H3 denoiser call on seeded inputs, for checking plans and
// memory: seeded video and audio latents and seeded stand-in text states (the text goes
// through the refiner first), one forward at --sigma under the plan given by the slice
// flags or by --budget, both velocities written to -o.
//
//   layerstream forward --model FILE --frames F --width W --height H --text-tokens L
//       --sigma X --seed S [--inputs FILE] [--keyframe FILE[@FRAME|@last] ...] [--mask FILE]
//       [--mlp-chunk N --attn-chunk N --final-chunk N --kv-tile N | --budget BYTES]
//       [--vram-budget BYTES [--no-prefetch | --keep-prefetch] | --resident-blocks N --slots 1|2 --kv-offload --residual-offload]
//       [--device cpu|cuda[:N]] [--threads N] [-o OUT.safetensors] [--json REPORT.json]
//   (--random-weights --preset tiny|small|h3 [--weights-seed N] [--blocks N] instead of
//   --model: synthetic weights made in host memory, the values make-model would write)
//
// --vram-budget is ONE number for everything LayerStream puts on the device (weights,
// AdaLN tables, activations, workspace; docs/budget.md): the planner keeps resident
// what fits, streams the other blocks through two slots, and offloads K/V and the
// residual to pinned host memory only when it must. Its choice is printed before any
// work; a budget below the minimum fails at once naming the minimum. None of these
// knobs changes an output bit (the output hash printed last says so).
//
// Seeded inputs: PyTorch's CPU randn restated (model/h3/torch_random.h): video from
// seed, audio from seed + 1, text states from seed + 2. --inputs FILE gives them instead
// ("video" f32 [C, T, Hl, Wl], "audio" f32 [Ca, 2, A], "text" f32 [L, text_dim], shapes
// from the clip flags; a wrong shape is refused naming the tensor): what a program
// using the C API compares against (examples/denoise.c).
// The chain (weights -> backend -> plan -> engine -> refine -> AdaLN -> forward) is
// api::Session's (src/api/session.h); this file holds the flags and the outputs.
// Keyframe files: "video" f32 [C, T, Hl, Wl] (+ optional "audio" f32 [C, 2, A]); the
// pixel frame comes from @FRAME, @last, the file's "pixel_frame" metadata, or 0.
// Mask file: optional "video_mask" f32 [T, Hl, Wl] and "audio_mask" f32 [2, A] (1 = denoise).
// Output: "video" f32 [latents_dim, T, Hl, Wl], "audio" f32 [audio_latents_dim, 2, A]
// (velocities, ComfyUI sign, bf16-exact), written atomically; metadata: sigma, seed, plan.
// stdout: one status line (paths engaged, slices, predicted / measured peak vs stock, time).
// Exit codes: 0 ok, 2 bad input (flags, files, budget too small), 1 runtime failure.
#include <cctype>
#include <map>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "api/session.h"
#include "core/arena.h"  // format_bytes
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/h3/torch_random.h"
#include "tools/command.h"
#include "tools/cli_util.h"
#include "tools/memory_plot.h"
#include "tools/progress.h"
#include "tools/report.h"

namespace ls::tools {
namespace {

constexpr const char* kCmd = "layerstream forward";

struct ForwardOptions {
  LoraFlags lora;  // --lora FILE[:STRENGTH] ..., --lora-dtype
  WeightFlags wflags;  // --format, --precision
  NumericsFlags numerics;  // --attention, --gemm-f32 (+ the developer variables)
  FlagText model, preset, weights_seed, blocks;
  FlagText frames, width, height, text_tokens, sigma, seed;
  std::vector<std::string> keyframes;
  FlagText mask, inputs;
  FlagText mlp_chunk, attn_chunk, final_chunk, kv_tile, budget;
  FlagText device, threads;
  FlagText devices;  // --devices: sequence-parallel ranks (docs/multi-gpu.md)
  FlagText output, json, memory_plot;
  bool random_weights = false, allow_nonfinite = false, quiet = false;
  FlagText vram_budget, resident_blocks, slots, kv_chunk;
  bool no_prefetch = false, keep_prefetch = false, kv_offload = false, residual_offload = false;
};

// fp32 tensor `name` of `file` with the expected shape; empty name -> not required.
Expected<std::vector<float>> read_f32(const SafetensorsReader& file, const std::string& name,
                                      const std::vector<int64_t>& shape) {
  const SafetensorsEntry* e = file.find(name);
  if (!e) return make_error(ErrorCode::invalid_file, file.path() + ": no tensor \"" + name + "\"");
  if (e->dtype != DType::f32 || e->shape != shape) {
    std::string want = "[";
    for (size_t i = 0; i < shape.size(); ++i) want += (i ? ", " : "") + std::to_string(shape[i]);
    want += "]";
    return make_error(ErrorCode::invalid_file, file.path() + ": \"" + name + "\" is " + file.view(*e).shape_str() +
                                                   ", expected f32 " + want);
  }
  const auto* p = static_cast<const float*>(file.data(*e));
  return std::vector<float>(p, p + e->numel());
}

Expected<h3::Keyframe> load_keyframe(const std::string& arg, const h3::H3Config& cfg, const h3::ClipGeometry& g) {
  std::string path = arg, frame;
  if (auto at = arg.rfind('@'); at != std::string::npos) path = arg.substr(0, at), frame = arg.substr(at + 1);
  LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(path));
  h3::Keyframe k;
  const SafetensorsEntry* v = file->find("video");
  // No "video" but an "audio": an audio-only keyframe (ComfyUI's AddGuide with audio only).
  if ((v && v->shape.size() != 4) || (!v && !file->find("audio")))
    return make_error(ErrorCode::invalid_file,
                      path + ": a keyframe file needs \"video\" f32 [C, T, Hl, Wl] and/or \"audio\" f32 [C, 2, A]");
  if (v) {
    k.video.T = v->shape[1], k.video.Hl = v->shape[2], k.video.Wl = v->shape[3];
    LS_ASSIGN_OR_RETURN(k.video.data, read_f32(*file, "video", {cfg.latents_dim, k.video.T, g.Hl, g.Wl}));
  }
  if (const SafetensorsEntry* a = file->find("audio")) {
    if (a->shape.size() != 3) return make_error(ErrorCode::invalid_file, path + ": \"audio\" must be f32 [C, 2, A]");
    k.audio.A = a->shape[2];
    LS_ASSIGN_OR_RETURN(k.audio.data, read_f32(*file, "audio", {cfg.audio_latents_dim, 2, k.audio.A}));
  }
  if (frame == "last") {
    k.pixel_frame = g.frames - 1;
  } else if (!frame.empty()) {
    LS_ASSIGN_OR_RETURN(k.pixel_frame, parse_int("--keyframe frame", frame, 0, g.frames - 1));
  } else if (auto it = file->metadata().find("pixel_frame"); it != file->metadata().end()) {
    LS_ASSIGN_OR_RETURN(k.pixel_frame, parse_int(path + " metadata pixel_frame", it->second, 0, g.frames - 1));
  }
  return k;
}

Status load_mask(const std::string& path, const h3::ClipGeometry& g, h3::Conditioning& c) {
  LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(path));
  const bool hv = file->find("video_mask") != nullptr, ha = file->find("audio_mask") != nullptr;
  if (!hv && !ha)
    return Status(make_error(ErrorCode::invalid_file, path + ": a mask file holds \"video_mask\" f32 [T, Hl, Wl] and/or "
                                                             "\"audio_mask\" f32 [2, A]"));
  if (hv) {
    LS_ASSIGN_OR_RETURN(c.video_mask, read_f32(*file, "video_mask", {g.T, g.Hl, g.Wl}));
  }
  if (ha) {
    LS_ASSIGN_OR_RETURN(c.audio_mask, read_f32(*file, "audio_mask", {2, g.A}));
  }
  return Status();
}

// The planner's prediction for the run (exec::plan_memory, every memory mode): the mode,
// its budget and minimum, and the device peak by component (what the arenas would hold
// on a device backend; the CPU's all-resident weights are the source's host views).
nlohmann::json memory_plan_json(const exec::PlanResult& r) {
  const exec::DevicePeak& d = r.peak;
  return {{"mode", exec::memory_mode_name(r.mode)},
          {"budget_bytes", r.budget_bytes},
          {"minimum_budget_bytes", r.minimum_budget_bytes},
          {"modulation_rows", r.modulation_rows},
          {"resident_blocks", d.resident_blocks},
          {"slots", d.slots},
          {"bytes", {{"block", d.block_bytes}, {"resident_weights", d.resident_weight_bytes}, {"slots", d.slot_bytes},
                     {"modulation_tables", d.modulation_table_bytes}, {"activations", d.activation_bytes},
                     {"workspace", d.workspace_bytes}, {"text_phase_extra", d.text_phase_extra_bytes},
                     {"precompute_scratch", d.precompute_scratch_bytes}}},
          {"steps_peak_bytes", d.steps_peak_bytes},
          {"text_peak_bytes", d.text_peak_bytes},
          {"precompute_peak_bytes", d.precompute_peak_bytes},
          {"predicted_peak_bytes", d.predicted_peak_bytes},
          {"host_pinned_bytes", d.host_pinned_bytes}};
}

int fail(const Error& e) { return report_error(kCmd, e); }
int usage(const std::string& msg) { return fail({ErrorCode::invalid_argument, msg}); }

int run_forward(const ForwardOptions& o) {
  // ---- flags: every refusal here is a usage error (exit 2), before any file is opened ----
  if (o.model.given() == o.preset.given())
    return usage("give exactly one of --model FILE or --preset NAME (synthetic weights)");
  if (o.random_weights && !o.preset.given())
    return usage("--random-weights needs --preset tiny|small|h3 (the shapes to make)");
  if (o.weights_seed.given() && o.model.given())
    return usage("--weights-seed has no effect with --model (a file has its own weights): it goes with --preset");
  if (o.blocks.given() && o.model.given()) return usage("--blocks goes with --preset (a file has its own blocks)");
  // The memory flags: one request, the library's one validation (api::resolve_memory,
  // the same rules and messages at every door).
  api::MemoryRequest memory_request;
  const MemoryFlags memory_flags{&o.vram_budget, &o.budget,    &o.mlp_chunk,      &o.attn_chunk,
                                 &o.final_chunk, &o.kv_chunk,  &o.resident_blocks, &o.slots,
                                 o.kv_offload,   o.residual_offload, o.no_prefetch, o.keep_prefetch};
  if (auto m = memory_from_flags(memory_flags, &memory_request); !m.ok()) return fail(m.error());

  auto frames = flag_int(o.frames, range::frames, 0);
  auto width = flag_int(o.width, range::width, 0);
  auto height = flag_int(o.height, range::height, 0);
  auto L = flag_int(o.text_tokens, range::text_tokens, 0);
  auto seed = flag_int(o.seed, range::seed, 0);
  auto wseed = flag_int(o.weights_seed, range::seed, 0);
  auto threads = flag_int(o.threads, range::threads, 0);
  auto mlp = flag_int(o.mlp_chunk, range::chunk, 0);
  auto attn = flag_int(o.attn_chunk, range::chunk, 0);
  auto fin = flag_int(o.final_chunk, range::chunk, 0);
  auto kv = flag_int(o.kv_tile, range::kv_tile, 1);  // not given: the device's (below)
  auto kvc = flag_int(o.kv_chunk, range::kv_chunk, 0);
  auto rb = flag_int(o.resident_blocks, range::resident_blocks, -1);
  auto sl = flag_int(o.slots, range::slots, 2);
  auto nb = flag_int(o.blocks, range::blocks, 0);
  for (const auto* e : {&frames, &width, &height, &L, &seed, &wseed, &threads, &mlp, &attn, &fin, &kv, &kvc, &rb, &sl, &nb})
    if (!e->ok()) return fail(e->error());
  auto sigma = flag_float32(o.sigma, range::sigma, 0.0f);
  if (!sigma.ok()) return fail(sigma.error());
  auto budget = flag_size(o.budget, range::budget, 0);
  if (!budget.ok()) return fail(budget.error());
  auto vram_budget = flag_size(o.vram_budget, range::budget, 0);
  if (!vram_budget.ok()) return fail(vram_budget.error());
  const std::string device = o.device.given() ? o.device.text : "cpu";
  std::vector<std::pair<std::string, std::string>> outputs;
  for (const FlagText* f : {&o.output, &o.json, &o.memory_plot})
    if (f->given()) outputs.emplace_back(f->name == "--output" ? "-o" : f->name, f->text);
  if (Status s = check_output_paths(outputs); !s.ok()) return fail(s.error());

  exec::PlanKnobs knobs;
  knobs.mlp_chunk_tokens = *mlp;
  knobs.attn_chunk_tokens = *attn;
  knobs.final_chunk_tokens = *fin;
  knobs.kv_tile = *kv;
  knobs.kv_offload = o.kv_offload;
  knobs.kv_chunk_rows = *kvc;
  knobs.residual_offload = o.residual_offload;
  exec::Residency residency;
  residency.resident_blocks = *rb;
  residency.slots = *sl;
  set_num_threads(static_cast<int>(*threads));

  // The backend first: what a flag means can depend on it (the chain: api::Session).
  // Numerics (every bit-changing setting): flags, then developer variables, resolved by
  // the backend; printed, and stored in the report and the output file.
  auto nc = numerics_from_flags_and_env(kCmd, o.numerics, o.kv_tile.given() ? *kv : 0);
  if (!nc.ok()) return fail(nc.error());
  // --devices: one backend per sequence-parallel rank (docs/multi-gpu.md).
  std::vector<std::string> rank_devices;
  if (o.devices.given()) {
    if (o.device.given()) return usage("--device and --devices are exclusive: --devices lists every rank's device");
    auto d = parse_devices("--devices", o.devices.text);
    if (!d.ok()) return usage(d.error().message);
    rank_devices = std::move(*d);
  } else {
    rank_devices = {o.device.given() ? o.device.text : "cpu"};
  }
  auto opened = api::Session::open_backends(rank_devices, nc->numerics, nc->diagnostics);
  if (!opened.ok()) return fail(opened.error());
  api::Session& session = **opened;
  if (Status s = api::check_memory_device(memory_request, session.device_is_cpu(), api::kFlagNames); !s.ok())
    return fail(s.error());
  if (!o.kv_tile.given()) knobs.kv_tile = 0;  // the device's (Session::resolve_kv_tile)

  // Weights.
  api::WeightsSpec weights;
  if (o.model.given()) {
    weights.model_path = o.model.text;
  } else {
    weights.preset = o.preset.text;
    weights.weights_seed = static_cast<uint64_t>(*wseed);
    if (o.blocks.given()) weights.blocks = *nb;
  }
  if (Status ws = apply_weight_flags(o.lora, o.wflags, o.model.given(), weights); !ws.ok()) return usage(ws.message());
  if (Status s = session.load_weights(weights); !s.ok()) return fail(s.error());
  // After the weights: attention auto resolves per model (Session::load_weights), so this
  // line names the algorithm that runs.
  std::printf("[LayerStream] numerics: %s\n", describe(session.backend().numerics()).c_str());
  const h3::H3TensorSource* src = &session.source();
  if (!weights.loras.empty() || weights.precision != "preserve" || session.config().quant.any())
    std::printf("[LayerStream] weights: %s\n", src->describe().c_str());  // LoRAs, formats, "lossy"
  const h3::H3Config& cfg = session.config();
  if (o.slots.given() && *rb >= cfg.num_layers)
    return usage("--slots has no effect: --resident-blocks " + std::to_string(*rb) + " keeps all " +
                 std::to_string(cfg.num_layers) + " blocks resident, so nothing streams");

  // Conditioning and plan: everything that can be refused is refused before any work.
  auto geom = h3::clip_geometry(*frames, *width, *height, *L);
  if (!geom.ok()) return fail(geom.error());
  h3::Conditioning cond;
  cond.geometry = *geom;
  cond.seed = static_cast<uint64_t>(*seed);
  for (const auto& k : o.keyframes) {
    auto kf = load_keyframe(k, cfg, *geom);
    if (!kf.ok()) return fail(kf.error());
    cond.keyframes.push_back(std::move(*kf));
  }
  if (o.mask.given())
    if (Status s = load_mask(o.mask.text, *geom, cond); !s.ok()) return fail(s.error());
  if (cfg.pdd_heads > 1) cond.sample_sigmas = {1.0f, *sigma, 0.0f};  // one-call stand-in schedule
  // Caller-given inputs (--inputs): shapes checked before any work.
  const h3::ClipGeometry& g = *geom;
  std::vector<float> video, audio, text;
  if (o.inputs.given()) {
    auto file = SafetensorsReader::open(o.inputs.text);
    if (!file.ok()) return fail(file.error());
    auto v = read_f32(**file, "video", {cfg.latents_dim, g.T, g.Hl, g.Wl});
    if (!v.ok()) return fail(v.error());
    auto a = read_f32(**file, "audio", {cfg.audio_latents_dim, 2, g.A});
    if (!a.ok()) return fail(a.error());
    auto t = read_f32(**file, "text", {g.text_tokens, cfg.text_dim});
    if (!t.ok()) return fail(t.error());
    video = std::move(*v), audio = std::move(*a), text = std::move(*t);
  }
  api::MemorySpec memory;
  memory.mode = o.vram_budget.given() ? api::MemoryMode::total_budget
                : o.budget.given()    ? api::MemoryMode::activation_budget
                                      : api::MemoryMode::knobs;
  memory.knobs = knobs;
  memory.residency = residency;
  memory.activation_budget = *budget;
  memory.total_budget = *vram_budget;
  memory.prefetch = !o.no_prefetch;
  memory.adaptive_slots = !o.keep_prefetch;
  auto run_plan = session.plan(cond, {*sigma}, memory);
  if (!run_plan.ok()) return fail(run_plan.error());
  nlohmann::json vram_budget_json;  // null unless --vram-budget
  uint64_t budget_line = 0;         // the memory plot's budget line
  if (run_plan->budget) {
    std::printf("[LayerStream] %s\n", run_plan->budget->describe().c_str());
    vram_budget_json = budget_plan_json(*run_plan->budget);
    std::fflush(stdout);
    budget_line = *vram_budget;
  }
  const exec::Plan* plan = &run_plan->plan;

  std::unique_ptr<Progress> bar;
  exec::EngineOptions eo;
  eo.check_finite = !o.allow_nonfinite;
  eo.record_memory = o.memory_plot.given();
  eo.progress = [&bar](int64_t done, int64_t) {
    if (bar) bar->set_done(done);
  };
  if (Status s = session.create_engine(*run_plan, eo); !s.ok()) return fail(s.error());

  // Seeded inputs (unless --inputs gave them).
  if (!o.inputs.given()) {
    video = h3::torch_cpu_randn(cond.seed, cfg.latents_dim * g.T * g.Hl * g.Wl);
    audio = h3::torch_cpu_randn(cond.seed + 1, cfg.audio_latents_dim * 2 * g.A);
    text = h3::torch_cpu_randn(cond.seed + 2, g.text_tokens * cfg.text_dim);
  }
  api::DenoiseCall call;
  call.cond = &cond;
  call.text = TensorView(text.data(), DType::f32, {g.text_tokens, cfg.text_dim});
  call.video = TensorView(video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl});
  call.audio = TensorView(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A});
  call.sigma = *sigma;
  call.plan = plan;
  bool forward_begun = false;
  call.before_forward = [&]() {
    forward_begun = true;
    if (!o.quiet) bar = std::make_unique<Progress>("forward", "blocks", cfg.num_layers);
  };
  auto r = session.denoise(call);
  if (!r.ok()) {
    if (bar) bar->abandon();
    Error e = r.error();
    if (forward_begun && e.code == ErrorCode::nonfinite)
      e.message += e.message.find("--allow-nonfinite") == std::string::npos
                       ? " (nothing written; --allow-nonfinite writes the output anyway)"
                       : " (nothing written)";
    return fail(e);
  }
  if (bar) bar->finish();

  // Non-finite outputs: an error (exit 1, nothing written) unless --allow-nonfinite.
  const int64_t bad_v = count_nonfinite(r->video.data(), r->video.size());
  const int64_t bad_a = count_nonfinite(r->audio.data(), r->audio.size());
  if (bad_v + bad_a > 0) {
    const std::string what = std::to_string(bad_v + bad_a) + " non-finite values (NaN or inf) in the output (video " +
                             std::to_string(bad_v) + " of " + std::to_string(r->video.size()) + ", audio " +
                             std::to_string(bad_a) + " of " + std::to_string(r->audio.size()) + ")";
    if (!o.allow_nonfinite)
      return fail({ErrorCode::nonfinite, what + "; nothing written (--allow-nonfinite writes the output anyway)"});
    std::fprintf(stderr, "%s: warning: %s; written anyway (--allow-nonfinite)\n", kCmd, what.c_str());
  }
  const uint64_t hash = r->hash();
  const std::string hash_hex = hex64(hash);

  // Only what determines the tensors' bytes: the weights, the inputs and the numerics
  // settings. No plan, budget, residency or timing: files of different memory settings
  // are byte-identical (`cmp`); those go to the --json report.
  char sigma_text[32];
  std::snprintf(sigma_text, sizeof sigma_text, "%.9g", static_cast<double>(*sigma));
  std::map<std::string, std::string> meta = {{"format", "layerstream-forward"},
                                             {"sigma", sigma_text},
                                             {"seed", std::to_string(*seed)},
                                             {"frames", std::to_string(g.frames)},
                                             {"width", std::to_string(g.width)},
                                             {"height", std::to_string(g.height)},
                                             {"text_tokens", std::to_string(g.text_tokens)},
                                             {"kv_tile", std::to_string(plan->kv_tile)},
                                             {"backend", backend_kind(session.backend().name())},
        {"numerics", describe(session.backend().numerics())},
                                             {"weights", src->describe()}};
  if (!o.keyframes.empty()) {
    std::string k;
    for (const auto& a : o.keyframes) k += (k.empty() ? "" : ";") + a;
    meta["keyframes"] = k;
  }
  if (o.mask.given()) meta["mask"] = o.mask.text;
  if (o.inputs.given()) meta["inputs"] = o.inputs.text;
  if (o.output.given()) {
    Status w = write_safetensors(
        o.output.text,
        {{"video", TensorView(r->video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})},
         {"audio", TensorView(r->audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A})}},
        meta);
    if (!w.ok()) return fail(w.error());
  }
  std::printf("%s\n", r->report.status_line().c_str());
  // cudaMemGetInfo's view: what the device lost between before create() and the
  // fullest moment sampled (after create, refinement, precompute and the forward),
  // including the CUDA context's lazily created pieces and allocator rounding.
  const uint64_t driver_used = session.driver_used_bytes();
  if (session.has_driver_memory_info())
    std::printf("[LayerStream] device memory (driver): %s used by this run at most; LayerStream's arenas peaked at %s\n",
                format_bytes(driver_used).c_str(), format_bytes(r->report.device_peak_bytes).c_str());
  std::printf("[LayerStream] output hash %s (FNV-1a 64 of the velocities)\n", hash_hex.c_str());
  if (o.memory_plot.given()) {
    MemoryPlotInput in;
    in.title = "forward, S " + std::to_string(plan->sizes.S) + ", " + session.backend().name() +
               (budget_line ? ", --vram-budget " + format_bytes(budget_line) : std::string());
    in.samples = r->report.memory;
    in.budget_bytes = budget_line;
    in.predicted_peak_bytes = vram_budget_json.is_null() ? 0 : vram_budget_json["predicted_peak_bytes"].get<uint64_t>();
    if (Status w = write_memory_plot(o.memory_plot.text, in); !w.ok()) return fail(w.error());
  }
  if (o.json.given()) {
    nlohmann::json j = nlohmann::json::parse(r->report.to_json());
    j["command"] = "forward";
    j["version"] = version_json();
    j["numerics"] = session.backend().numerics();
    j["numerics_from_env"] = nc->from_env;
    j["output_hash"] = hash_hex;
    j["nonfinite_values"] = bad_v + bad_a;
    j["driver_used_bytes"] = driver_used;
    j["plan"] = plan_json(*plan);
    j["vram_budget"] = vram_budget_json;
    j["memory_plan"] = memory_plan_json(*run_plan);
    j["weights"] = src->describe();
    if (o.output.given()) j["output"] = o.output.text;
    if (Status w = write_json_file(o.json.text, j); !w.ok()) return fail(w.error());
  }
  return 0;
}

CommandRun setup(CLI::App& sub) {
  auto o = std::make_shared<ForwardOptions>();
  add_text_flag(sub, "--model", o->model, "FILE", "H3 checkpoint (.safetensors); or --preset");
  add_text_flag(sub, "--preset", o->preset, "NAME", "synthetic weights of a preset instead of --model: tiny | small | h3");
  add_int_flag(sub, "--weights-seed", o->weights_seed, range::seed, "with --preset: seed of the synthetic weights", "0");
  add_int_flag(sub, "--blocks", o->blocks, range::blocks, "with --preset: number of DiT blocks (full width, fewer blocks)",
               "the preset's");
  add_int_flag(sub, "--frames", o->frames, range::frames, "pixel frames, snapped up to 17j+5", "", true);
  add_int_flag(sub, "--width", o->width, range::width, "width in pixels, a multiple of 32", "", true);
  add_int_flag(sub, "--height", o->height, range::height, "height in pixels, a multiple of 32", "", true);
  add_int_flag(sub, "--text-tokens", o->text_tokens, range::text_tokens, "tokens of the seeded stand-in text", "", true);
  add_float_flag(sub, "--sigma", o->sigma, range::sigma, "video sigma of the call", "", true);
  add_int_flag(sub, "--seed", o->seed, range::seed,
               "seed of the inputs (video, audio, text) and of the noise augmentation", "0");
  sub.add_option("--keyframe", o->keyframes, "keyframe latent FILE[@FRAME|@last]: \"video\" [C, T, Hl, Wl] (+ \"audio\"), or \"audio\" alone")
      ->type_name("FILE[@FRAME]");
  add_text_flag(sub, "--inputs", o->inputs, "FILE",
                "caller-given inputs instead of the seeded ones: \"video\" f32 [C, T, Hl, Wl], \"audio\" f32 "
                "[Ca, 2, A], \"text\" f32 [L, text_dim] (raw text states), shapes matching the clip flags");
  add_text_flag(sub, "--mask", o->mask, "FILE", "inpainting mask: \"video_mask\" [T, Hl, Wl] and/or \"audio_mask\" [2, A]");
  add_int_flag(sub, "--mlp-chunk", o->mlp_chunk, range::chunk, "rows per MLP / patch-embedding slice (0 = all)", "0");
  add_int_flag(sub, "--attn-chunk", o->attn_chunk, range::chunk, "rows per attention slice, two-pass (0 = stock attention)",
               "0");
  add_int_flag(sub, "--final-chunk", o->final_chunk, range::chunk, "rows per final-layer slice (0 = all)", "0");
  add_int_flag(sub, "--kv-tile", o->kv_tile, range::kv_tile,
               "keys per attention tile: a numerics setting (1024 on the CPU, 8192 with CUDA + cuDNN)", "the device's");
  add_numerics_flags(sub, o->numerics);
  add_lora_flags(sub, o->lora);
  add_weight_flags(sub, o->wflags);
  add_size_flag(sub, "--budget", o->budget, range::budget,
                "activation memory budget: the largest slices that fit (not with the chunk flags)");
  sub.add_flag("--random-weights", o->random_weights,
               "with --preset (which implies it): synthetic weights made in host memory (a 33 B model needs ~66 GiB)");
  add_size_flag(sub, "--vram-budget", o->vram_budget, range::budget,
                "TOTAL device budget (CUDA): weights, AdaLN tables, activations, workspace; the planner streams "
                "blocks and offloads K/V and the residual as needed");
  sub.add_flag("--no-prefetch", o->no_prefetch, "with --vram-budget: one block slot (copy, then compute) instead of two");
  sub.add_flag("--keep-prefetch", o->keep_prefetch,
               "with --vram-budget: two block slots even when offloading, where the planner would give the second "
               "slot's bytes to larger slices (one slot) because that exposes less transfer");
  add_int_flag(sub, "--resident-blocks", o->resident_blocks, range::resident_blocks,
               "manual residency: blocks kept on the device (the rest stream)", "all");
  add_int_flag(sub, "--slots", o->slots, range::slots,
               "with --resident-blocks: slots for streamed blocks, 2 (prefetch) or 1", "2");
  sub.add_flag("--kv-offload", o->kv_offload,
               "manual: K/V in pinned host memory, streamed back per query slice (needs --attn-chunk)");
  add_int_flag(sub, "--kv-chunk", o->kv_chunk, range::kv_chunk,
               "with --kv-offload: keys per streamed K/V chunk, a multiple of --kv-tile (0 = about 4096)", "0");
  sub.add_flag("--residual-offload", o->residual_offload,
               "manual: the residual stream in pinned host memory (needs --attn-chunk)");
  sub.add_flag("--allow-nonfinite", o->allow_nonfinite,
               "write the output even when it holds NaN or inf (a warning gives the count); without it such a run "
               "fails (exit 1) naming the first block and phase, and writes nothing");
  add_text_flag(sub, "--json", o->json, "FILE", "write the run report (plan, peaks, PCIe bytes, time, output hash, version)");
  add_text_flag(sub, "--memory-plot", o->memory_plot, "FILE.svg",
                "draw the device memory over the run by phase and block (SVG)");
  add_text_flag(sub, "--device", o->device, "DEVICE", "cpu | cuda | cuda:N", "cpu");
  add_text_flag(sub, "--devices", o->devices, "LIST",
                "sequence parallel over several devices (one rank each, output bytes equal one device's): "
                "cuda:0,cuda:1,... or cpu*N (N in-process CPU ranks); the count must divide the model's heads; "
                "budgets are per device");
  add_int_flag(sub, "--threads", o->threads, range::threads, "CPU threads (0 = all cores)", "0");
  sub.add_flag("-q,--quiet", o->quiet, "no progress display");
  add_text_flag(sub, "-o,--output", o->output, "FILE",
                "output velocities (.safetensors); optional, the hash is always printed");
  return [o]() { return run_forward(*o); };
}

LS_REGISTER_COMMAND(forward_cmd, "forward", "one H3 denoiser call on seeded inputs; writes both velocities", setup);

}  // namespace
}  // namespace ls::tools
