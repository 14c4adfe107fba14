// `layerstream forward`: ONE H3 denoiser call on seeded inputs, for checking plans and
// memory: seeded video and audio latents and seeded stand-in text states (the text goes
// through the refiner first), one forward at --sigma under the plan given by the slice
// flags or by --budget, both velocities written to -o.
//
//   layerstream forward --model FILE --frames F --width W --height H --text-tokens L
//       --sigma X --seed S [--keyframe FILE[@FRAME|@last] ...] [--mask FILE]
//       [--mlp-chunk N --attn-chunk N --final-chunk N --kv-tile N | --budget BYTES]
//       [--vram-budget BYTES [--no-prefetch] | --resident-blocks N --slots 1|2 --kv-offload --residual-offload]
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
// seed, audio from seed + 1, text states from seed + 2.
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

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "exec/budget_plan.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "model/h3/torch_random.h"
#include "tools/command.h"
#include "tools/cli_util.h"
#include "tools/report.h"

namespace ls::tools {
namespace {

constexpr const char* kCmd = "layerstream forward";

struct ForwardOptions {
  std::string model, preset, weights_seed = "0", blocks;
  std::string frames, width, height, text_tokens, sigma, seed = "0";
  std::vector<std::string> keyframes;
  std::string mask;
  std::string mlp_chunk = "0", attn_chunk = "0", final_chunk = "0", kv_tile, budget;
  std::string device = "cpu", threads = "0";
  std::string output, json;
  bool random_weights = false;
  std::string vram_budget, resident_blocks, slots, kv_chunk = "0";
  bool no_prefetch = false, kv_offload = false, residual_offload = false;
};

Expected<float> parse_sigma(const std::string& text) {
  size_t used = 0;
  float v = 0;
  bool ok = !text.empty();
  if (ok) {
    try {
      v = std::stof(text, &used);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok || used != text.size() || !(v > 0.0f && v <= 1.0f))
    return make_error(ErrorCode::invalid_argument, "--sigma must be a number in (0, 1] (got '" + text + "')");
  return v;
}

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
  if (!v || v->shape.size() != 4)
    return make_error(ErrorCode::invalid_file, path + ": a keyframe file needs \"video\" f32 [C, T, Hl, Wl]");
  k.video.T = v->shape[1], k.video.Hl = v->shape[2], k.video.Wl = v->shape[3];
  LS_ASSIGN_OR_RETURN(k.video.data, read_f32(*file, "video", {cfg.latents_dim, k.video.T, g.Hl, g.Wl}));
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

int fail(const Error& e) {
  std::fprintf(stderr, "%s: error: %s\n", kCmd, e.message.c_str());
  return e.code == ErrorCode::invalid_argument || e.code == ErrorCode::invalid_file ||
                 e.code == ErrorCode::out_of_budget || e.code == ErrorCode::not_found || e.code == ErrorCode::io ||
                 e.code == ErrorCode::unsupported
             ? 2
             : 1;
}

int run_forward(const ForwardOptions& o) {
  if (o.model.empty() == o.preset.empty())
    return fail({ErrorCode::invalid_argument, "give exactly one of --model FILE or --random-weights --preset NAME"});
  if (o.random_weights && o.preset.empty())
    return fail({ErrorCode::invalid_argument, "--random-weights needs --preset tiny|small|h3 (the shapes to make)"});
  const bool manual_residency =
      !o.resident_blocks.empty() || !o.slots.empty() || o.kv_offload || o.residual_offload || o.kv_chunk != "0";
  if (!o.vram_budget.empty() && (manual_residency || !o.budget.empty()))
    return fail({ErrorCode::invalid_argument,
                 "--vram-budget decides residency, offload and slices: give it alone (no --budget, --resident-blocks, "
                 "--slots, --kv-offload, --residual-offload)"});
  if (o.no_prefetch && o.vram_budget.empty())
    return fail({ErrorCode::invalid_argument, "--no-prefetch goes with --vram-budget (else use --slots 1)"});
  if (!o.blocks.empty() && o.preset.empty()) return fail({ErrorCode::invalid_argument, "--blocks goes with --preset (a file has its own blocks)"});
  for (const auto* f : {&o.frames, &o.width, &o.height, &o.text_tokens, &o.sigma})
    if (f->empty()) return fail({ErrorCode::invalid_argument, "--frames, --width, --height, --text-tokens and --sigma are required"});
  const bool sliced_flags = o.mlp_chunk != "0" || o.attn_chunk != "0" || o.final_chunk != "0";
  if (!o.budget.empty() && sliced_flags)
    return fail({ErrorCode::invalid_argument, "--budget picks the slice sizes: give it or --mlp-chunk/--attn-chunk/--final-chunk, not both"});

  auto frames = parse_int("--frames", o.frames, 1, 100000);
  auto width = parse_int("--width", o.width, 32, 65536);
  auto height = parse_int("--height", o.height, 32, 65536);
  auto L = parse_int("--text-tokens", o.text_tokens, 0, 1000000);
  auto seed = parse_int("--seed", o.seed, 0, INT64_MAX);
  auto wseed = parse_int("--weights-seed", o.weights_seed, 0, INT64_MAX);
  auto threads = parse_int("--threads", o.threads, 0, 4096);
  auto sigma = parse_sigma(o.sigma);
  exec::PlanKnobs knobs;
  auto mlp = parse_int("--mlp-chunk", o.mlp_chunk, 0, INT64_MAX);
  auto attn = parse_int("--attn-chunk", o.attn_chunk, 0, INT64_MAX);
  auto fin = parse_int("--final-chunk", o.final_chunk, 0, INT64_MAX);
  auto kv = parse_int("--kv-tile", o.kv_tile.empty() ? "1" : o.kv_tile, 1, INT64_MAX);  // empty: the device's
  for (const auto* e : {&frames, &width, &height, &L, &seed, &wseed, &threads, &mlp, &attn, &fin, &kv})
    if (!e->ok()) return fail(e->error());
  if (!sigma.ok()) return fail(sigma.error());
  knobs.mlp_chunk_tokens = *mlp;
  knobs.attn_chunk_tokens = *attn;
  knobs.final_chunk_tokens = *fin;
  knobs.kv_tile = *kv;
  knobs.kv_offload = o.kv_offload;
  auto kvc = parse_int("--kv-chunk", o.kv_chunk, 0, INT64_MAX);
  if (!kvc.ok()) return fail(kvc.error());
  knobs.kv_chunk_rows = *kvc;
  knobs.residual_offload = o.residual_offload;
  exec::Residency residency;
  if (!o.resident_blocks.empty()) {
    auto rb = parse_int("--resident-blocks", o.resident_blocks, 0, 100000);
    if (!rb.ok()) return fail(rb.error());
    residency.resident_blocks = *rb;
  }
  if (!o.slots.empty()) {
    auto sl = parse_int("--slots", o.slots, 1, 2);
    if (!sl.ok()) return fail(sl.error());
    residency.slots = *sl;
  }
  set_num_threads(static_cast<int>(*threads));

  // Weights.
  std::unique_ptr<h3::H3TensorSource> src;
  if (!o.model.empty()) {
    auto f = h3::open_h3_checkpoint(o.model);
    if (!f.ok()) return fail(f.error());
    src = std::move(*f);
  } else {
    auto cfg = h3::h3_preset(o.preset);
    if (!cfg.ok()) return fail(cfg.error());
    if (!o.blocks.empty()) {
      auto nb = parse_int("--blocks", o.blocks, 1, 1000);
      if (!nb.ok()) return fail(nb.error());
      cfg->num_layers = *nb;  // full width, fewer blocks (as make-model --blocks)
    }
    src = std::make_unique<h3::H3SyntheticSource>(*cfg, static_cast<uint64_t>(*wseed));
  }
  const h3::H3Config& cfg = src->cfg();

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
  if (!o.mask.empty())
    if (Status s = load_mask(o.mask, *geom, cond); !s.ok()) return fail(s.error());
  if (cfg.pdd_heads > 1) cond.sample_sigmas = {1.0f, *sigma, 0.0f};  // one-call stand-in schedule
  auto backend = make_backend(o.device);
  if (!backend.ok()) return fail(backend.error());
  if (o.kv_tile.empty()) knobs.kv_tile = (*backend)->default_kv_tile();
  Expected<exec::Plan> plan = Error{};
  nlohmann::json vram_budget_json;  // null unless --vram-budget
  if (!o.vram_budget.empty()) {
    auto bytes = exec::parse_byte_size(o.vram_budget);
    if (!bytes.ok()) return fail(bytes.error());
    exec::BudgetOptions bo;
    bo.kv_tile = knobs.kv_tile;
    bo.workspace_bytes = (*backend)->workspace_bytes();
    bo.prefetch = !o.no_prefetch;
    auto rows = exec::modulation_rows_for(cfg, cond, {*sigma});
    if (!rows.ok()) return fail(rows.error());
    bo.modulation_rows = *rows;
    auto bp = exec::plan_total_budget(cfg, cond, *bytes, bo);
    if (!bp.ok()) return fail(bp.error());
    std::printf("[LayerStream] %s\n", bp->describe().c_str());
    vram_budget_json = budget_plan_json(*bp);
    std::fflush(stdout);
    residency.resident_blocks = bp->resident_blocks;
    residency.slots = bp->prefetch ? 2 : 1;
    plan = bp->activations;
  } else if (!o.budget.empty()) {
    auto bytes = exec::parse_byte_size(o.budget);
    if (!bytes.ok()) return fail(bytes.error());
    plan = exec::plan_for_budget(cfg, cond, *bytes, knobs.kv_tile);
  } else {
    plan = exec::make_plan(cfg, cond, knobs);
  }
  if (!plan.ok()) return fail(plan.error());

  // Device memory as the driver sees it, before LayerStream takes any (CUDA).
  uint64_t free0 = 0, total = 0;
  const bool have_info = (*backend)->device_memory_info(&free0, &total).ok();
  uint64_t min_free = free0;
  auto sample_free = [&]() {
    uint64_t f = 0, t = 0;
    if (have_info && (*backend)->device_memory_info(&f, &t).ok()) min_free = std::min(min_free, f);
  };
  exec::EngineOptions eo;
  eo.residency = residency;
  auto engine = exec::Engine::create(*src, **backend, eo);
  if (!engine.ok()) return fail(engine.error());
  sample_free();

  // Seeded inputs.
  const h3::ClipGeometry& g = *geom;
  std::vector<float> video = h3::torch_cpu_randn(cond.seed, cfg.latents_dim * g.T * g.Hl * g.Wl);
  std::vector<float> audio = h3::torch_cpu_randn(cond.seed + 1, cfg.audio_latents_dim * 2 * g.A);
  std::vector<float> text = h3::torch_cpu_randn(cond.seed + 2, g.text_tokens * cfg.text_dim);
  auto refined = (*engine)->refine_text(TensorView(text.data(), DType::f32, {g.text_tokens, cfg.text_dim}));
  if (!refined.ok()) return fail(refined.error());
  sample_free();
  if (Status s = (*engine)->precompute_adaln({*sigma}, cond); !s.ok()) return fail(s.error());
  sample_free();
  if (Status s = (*engine)->prepare(cond, *plan); !s.ok()) return fail(s.error());
  auto r = (*engine)->forward(cond, *refined, TensorView(video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl}),
                              TensorView(audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A}), *sigma, *plan);
  if (!r.ok()) return fail(r.error());
  sample_free();
  const uint64_t hash = r->hash();
  char hash_hex[17];
  std::snprintf(hash_hex, sizeof hash_hex, "%016llx", static_cast<unsigned long long>(hash));

  // No plan or timing in the metadata: files of different plans must be byte-identical.
  std::map<std::string, std::string> meta = {{"format", "layerstream-forward"},
                                             {"sigma", o.sigma},
                                             {"seed", std::to_string(*seed)},
                                             {"kv_tile", std::to_string(plan->kv_tile)},
                                             {"weights", src->describe()}};
  if (!o.output.empty()) {
    Status w = write_safetensors(
        o.output,
        {{"video", TensorView(r->video.data(), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})},
         {"audio", TensorView(r->audio.data(), DType::f32, {cfg.audio_latents_dim, 2, g.A})}},
        meta);
    if (!w.ok()) return fail(w.error());
  }
  std::printf("%s\n", r->report.status_line().c_str());
  // cudaMemGetInfo's view: what the device lost between before create() and the
  // fullest moment sampled (after create, refinement, precompute and the forward),
  // including the CUDA context's lazily created pieces and allocator rounding.
  const uint64_t driver_used = have_info ? free0 - min_free : 0;
  if (have_info)
    std::printf("[LayerStream] device memory (driver): %s used by this run at most; LayerStream's arenas peaked at %s\n",
                format_bytes(driver_used).c_str(), format_bytes(r->report.device_peak_bytes).c_str());
  std::printf("[LayerStream] output hash %s (FNV-1a 64 of the velocities)\n", hash_hex);
  if (!o.json.empty()) {
    nlohmann::json j = nlohmann::json::parse(r->report.to_json());
    j["output_hash"] = hash_hex;
    j["driver_used_bytes"] = driver_used;
    j["plan"] = plan_json(*plan);
    j["vram_budget"] = vram_budget_json;
    j["weights"] = src->describe();
    if (Status w = write_json_file(o.json, j); !w.ok()) return fail(w.error());
  }
  return 0;
}

CommandRun setup(CLI::App& sub) {
  auto o = std::make_shared<ForwardOptions>();
  sub.add_option("--model", o->model, "H3 checkpoint (.safetensors)");
  sub.add_option("--preset", o->preset, "synthetic weights of a preset instead of --model: tiny | small | h3");
  sub.add_option("--weights-seed", o->weights_seed, "seed of the synthetic weights (--preset; default 0)");
  sub.add_option("--blocks", o->blocks, "with --preset: number of DiT blocks (full width, fewer blocks)");
  sub.add_option("--frames", o->frames, "pixel frames, snapped up to 17j+5");
  sub.add_option("--width", o->width, "width in pixels, multiple of 32");
  sub.add_option("--height", o->height, "height in pixels, multiple of 32");
  sub.add_option("--text-tokens", o->text_tokens, "tokens of the seeded stand-in text");
  sub.add_option("--sigma", o->sigma, "video sigma of the call, in (0, 1]");
  sub.add_option("--seed", o->seed, "seed of the inputs (video, audio, text) and of the noise augmentation (default 0)");
  sub.add_option("--keyframe", o->keyframes, "keyframe latent FILE[@FRAME|@last]: \"video\" [C, T, Hl, Wl] (+ \"audio\")");
  sub.add_option("--mask", o->mask, "inpainting mask FILE: \"video_mask\" [T, Hl, Wl] and/or \"audio_mask\" [2, A]");
  sub.add_option("--mlp-chunk", o->mlp_chunk, "rows per MLP / patch-embedding slice (0 = all)");
  sub.add_option("--attn-chunk", o->attn_chunk, "rows per attention slice, two-pass (0 = stock attention)");
  sub.add_option("--final-chunk", o->final_chunk, "rows per final-layer slice (0 = all)");
  sub.add_option("--kv-tile", o->kv_tile, "keys per attention tile: a numerics setting (default: the device's, 1024 on the CPU, 8192 with CUDA + cuDNN)");
  sub.add_option("--budget", o->budget, "activation memory budget (512M, 3G, 3.5GiB): the largest slices that fit");
  sub.add_flag("--random-weights", o->random_weights,
               "synthetic weights of --preset made in host memory (no file; a 33 B model needs ~66 GB of RAM)");
  sub.add_option("--vram-budget", o->vram_budget,
                 "TOTAL device budget (24G, 8G, 3.5GiB): weights, AdaLN tables, activations, workspace; the planner "
                 "streams blocks and offloads K/V and the residual as needed");
  sub.add_flag("--no-prefetch", o->no_prefetch, "with --vram-budget: one block slot (copy, then compute) instead of two");
  sub.add_option("--resident-blocks", o->resident_blocks, "manual: blocks kept on the device (the rest stream)");
  sub.add_option("--slots", o->slots, "manual: slots for streamed blocks, 2 (prefetch) or 1");
  sub.add_flag("--kv-offload", o->kv_offload, "manual: K/V in pinned host memory, streamed back per query slice (needs --attn-chunk)");
  sub.add_option("--kv-chunk", o->kv_chunk, "manual, with --kv-offload: keys per streamed K/V chunk (a multiple of --kv-tile; 0 = about 4096)");
  sub.add_flag("--residual-offload", o->residual_offload, "manual: the residual stream in pinned host memory (needs --attn-chunk)");
  sub.add_option("--json", o->json, "write the run report (plan, peaks, PCIe bytes, time, output hash) as JSON");
  sub.add_option("--device", o->device, "cpu | cuda | cuda:N (default cpu)");
  sub.add_option("--threads", o->threads, "CPU threads (0 = all cores)");
  sub.add_option("-o,--output", o->output, "output velocities (.safetensors); optional, the hash is always printed");
  return [o]() { return run_forward(*o); };
}

LS_REGISTER_COMMAND(forward_cmd, "forward", "one H3 denoiser call on seeded inputs; writes both velocities", setup);

}  // namespace
}  // namespace ls::tools
