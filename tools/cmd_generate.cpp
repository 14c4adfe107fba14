// `layerstream generate`: a whole sampling run (simple schedule, flow Euler, CFG) on an
// H3 checkpoint or a synthetic preset, writing the final video and audio latents.
//
// With neither --model nor --preset it is the built-in demonstration: a tiny H3-shaped
// model with deterministic synthetic weights generates a short clip twice, with the
// stock plan and with a sliced plan (two-pass attention, sliced MLP, sliced head),
// prints the activation memory each needed and compares the two outputs byte for byte;
// it exits 1 if they differ (the exactness contract, DESIGN.md §1).
//
// Output (-o): safetensors with "video" fp32 [latents_dim, T, Hl, Wl] and "audio" fp32
// [audio_latents_dim, 2, A] (process_latent_out applied: the real audio latent, not the
// carried one), written atomically (temporary file + rename): a failed run leaves no file.
// stdout: the schedule, the plan(s), one status line per run (and the comparison);
// stderr: progress (a bar on a terminal, plain lines otherwise) and errors.
// Exit codes: 0 ok, 2 bad input (flags, files, budget too small), 1 runtime failure or
// (built-in demonstration) outputs that differ.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"  // format_bytes
#include "core/thread_pool.h"
#include "exec/budget_plan.h"
#include "exec/engine.h"
#include "exec/plan.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "sample/generate.h"
#include "sample/schedule.h"
#include "tools/command.h"
#include "tools/progress.h"
#include "tools/report.h"
#include "tools/cli_util.h"

namespace ls::tools {
namespace {

constexpr const char* kCmd = "layerstream generate";

// Numbers are taken as strings and parsed here so that a bad value is exit code 2 with
// a message naming the flag (CLI11's own conversion errors use other exit codes).
struct GenerateOptions {
  std::string model, preset, weights_seed = "0";
  std::string steps = "4", cfg = "1.0", seed = "0";
  std::string frames = "22", width = "256", height = "256", text_tokens;
  std::string text;
  std::vector<std::string> keyframes, refs;
  std::string mlp_chunk, attn_chunk, final_chunk, kv_tile, budget, vram_budget;
  std::string device = "cpu", threads;
  std::string json, output;
  bool quiet = false;
};

int exit_code_for(const Error& e) {
  switch (e.code) {
    case ErrorCode::invalid_argument:
    case ErrorCode::invalid_file:
    case ErrorCode::unsupported:
    case ErrorCode::out_of_budget:
    case ErrorCode::not_found:
      return 2;
    default:
      return 1;
  }
}

int fail(const Error& e) {
  std::fprintf(stderr, "%s: error: %s\n", kCmd, e.message.c_str());
  return exit_code_for(e);
}
int fail(const std::string& msg, int code = 2) {
  std::fprintf(stderr, "%s: error: %s\n", kCmd, msg.c_str());
  return code;
}


Expected<uint64_t> parse_u64(const std::string& flag, const std::string& text) {
  size_t used = 0;
  unsigned long long v = 0;
  bool ok = !text.empty() && std::isdigit(static_cast<unsigned char>(text[0])) != 0;
  if (ok) {
    try {
      v = std::stoull(text, &used);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok || used != text.size())
    return make_error(ErrorCode::invalid_argument, flag + " must be a non-negative integer below 2^64 (got '" + text + "')");
  return static_cast<uint64_t>(v);
}

Expected<double> parse_double(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  bool ok = !text.empty();
  if (ok) {
    try {
      v = std::stod(text, &used);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok || used != text.size() || !std::isfinite(v))
    return make_error(ErrorCode::invalid_argument, flag + " must be a finite number (got '" + text + "')");
  return v;
}

// A float tensor of a safetensors file as fp32 values, with its shape checked.
Expected<std::vector<float>> read_f32(const SafetensorsReader& f, const std::string& name, int ndim,
                                      std::vector<int64_t>& shape) {
  const SafetensorsEntry* e = f.find(name);
  if (!e) return make_error(ErrorCode::invalid_file, f.path() + " has no tensor \"" + name + "\"");
  if (e->dtype != DType::f32 && e->dtype != DType::bf16 && e->dtype != DType::f16)
    return make_error(ErrorCode::invalid_file, f.path() + ": tensor \"" + name + "\" must be F32, BF16 or F16 (is " +
                                                   dtype_safetensors_name(e->dtype) + ")");
  if (static_cast<int>(e->shape.size()) != ndim)
    return make_error(ErrorCode::invalid_file, f.path() + ": tensor \"" + name + "\" must have " + std::to_string(ndim) +
                                                   " dimensions (has " + std::to_string(e->shape.size()) + ")");
  shape = e->shape;
  std::vector<float> out(static_cast<size_t>(e->numel()));
  const void* data = f.data(*e);
  for (int64_t i = 0; i < e->numel(); ++i) out[static_cast<size_t>(i)] = load_as_f32(data, e->dtype, i);
  return out;
}

// "FILE" or "FILE@FRAME" (FRAME: a pixel frame index or "last").
struct KeyframeArg {
  std::string path;
  std::optional<int64_t> frame;  // nullopt = from the file's metadata or 0
  bool last = false;
};
Expected<KeyframeArg> parse_keyframe_arg(const std::string& arg) {
  KeyframeArg k;
  k.path = arg;
  const size_t at = arg.rfind('@');
  if (at != std::string::npos && at + 1 < arg.size()) {
    const std::string f = arg.substr(at + 1);
    if (f == "last") {
      k.last = true;
      k.path = arg.substr(0, at);
    } else if (std::all_of(f.begin(), f.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
      LS_ASSIGN_OR_RETURN(int64_t fr, parse_int("--keyframe frame", f, 0, 10000000));
      k.frame = fr;
      k.path = arg.substr(0, at);
    }
  }
  return k;
}

Status load_video_latent(const SafetensorsReader& f, const h3::H3Config& cfg, h3::VideoLatent& out) {
  std::vector<int64_t> shape;
  LS_ASSIGN_OR_RETURN(out.data, read_f32(f, "video", 4, shape));
  if (shape[0] != cfg.latents_dim)
    return make_error(ErrorCode::invalid_file, f.path() + ": \"video\" has " + std::to_string(shape[0]) +
                                                   " channels; the model's video latents have " +
                                                   std::to_string(cfg.latents_dim));
  out.T = shape[1];
  out.Hl = shape[2];
  out.Wl = shape[3];
  return {};
}

Status load_audio_latent(const SafetensorsReader& f, const h3::H3Config& cfg, h3::AudioLatent& out) {
  std::vector<int64_t> shape;
  LS_ASSIGN_OR_RETURN(out.data, read_f32(f, "audio", 3, shape));
  if (shape[0] != cfg.audio_latents_dim || shape[1] != 2)
    return make_error(ErrorCode::invalid_file, f.path() + ": \"audio\" must be [" + std::to_string(cfg.audio_latents_dim) +
                                                   ", 2, A]");
  out.A = shape[2];
  return {};
}

Status load_keyframe(const std::string& arg, const h3::H3Config& cfg, const h3::ClipGeometry& g, h3::Keyframe& kf) {
  LS_ASSIGN_OR_RETURN(KeyframeArg ka, parse_keyframe_arg(arg));
  LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(ka.path));
  LS_TRY(load_video_latent(*file, cfg, kf.video));
  if (kf.video.Hl != g.Hl || kf.video.Wl != g.Wl)
    return make_error(ErrorCode::invalid_file, ka.path + ": keyframe latent is " + std::to_string(kf.video.Hl) + "x" +
                                                   std::to_string(kf.video.Wl) + " but the clip's latent is " +
                                                   std::to_string(g.Hl) + "x" + std::to_string(g.Wl));
  if (file->find("audio")) LS_TRY(load_audio_latent(*file, cfg, kf.audio));
  if (ka.last) {
    kf.pixel_frame = g.frames - 1;
  } else if (ka.frame) {
    kf.pixel_frame = *ka.frame;
  } else {
    auto it = file->metadata().find("pixel_frame");
    kf.pixel_frame = 0;
    if (it != file->metadata().end()) {
      LS_ASSIGN_OR_RETURN(kf.pixel_frame, parse_int(ka.path + " metadata pixel_frame", it->second, 0, 10000000));
    }
  }
  if (kf.pixel_frame >= g.frames)
    return make_error(ErrorCode::invalid_argument, ka.path + ": keyframe at pixel frame " + std::to_string(kf.pixel_frame) +
                                                       " is past the clip's last frame " + std::to_string(g.frames - 1));
  return {};
}

Status load_reference(const std::string& path, const h3::H3Config& cfg, h3::Reference& ref) {
  LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(path));
  const bool has_v = file->find("video") != nullptr, has_a = file->find("audio") != nullptr;
  if (!has_v && !has_a)
    return make_error(ErrorCode::invalid_file, path + ": a reference needs a \"video\" and/or an \"audio\" tensor");
  if (has_v) LS_TRY(load_video_latent(*file, cfg, ref.video));
  if (has_a) LS_TRY(load_audio_latent(*file, cfg, ref.audio));
  ref.kind = has_v && has_a ? h3::ReferenceKind::video_audio
             : has_a        ? h3::ReferenceKind::audio
             : ref.video.T == 1 ? h3::ReferenceKind::image
                                : h3::ReferenceKind::video;
  return {};
}

std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "index %zu (%.9g vs %.9g)", i, static_cast<double>(a[i]), static_cast<double>(b[i]));
      return buf;
    }
  return a.size() == b.size() ? "none" : "sizes differ";
}

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct RunSpec {
  std::string label;
  sample::GenerateRequest req;
};

// What a --vram-budget run used: LayerStream's device peak over its forwards, and the
// block-weight bytes streamed host -> device in all (0 when every block is resident).
struct VramUse {
  uint64_t peak = 0, weight_copies = 0;
};
VramUse vram_use(const sample::GenerateResult& r) {
  VramUse u;
  for (const sample::ForwardRecord& f : r.forwards) {
    u.peak = std::max(u.peak, f.report.device_peak_bytes);
    u.weight_copies += f.report.pcie_weight_bytes;
  }
  return u;
}

int run_generate(const GenerateOptions& o) {
  const bool builtin = o.model.empty() && o.preset.empty();
  if (!o.model.empty() && !o.preset.empty()) return fail("give --model or --preset, not both");
  if (!builtin && o.output.empty()) return fail("-o OUT.safetensors is required with --model or --preset");
  const bool any_chunk = !o.mlp_chunk.empty() || !o.attn_chunk.empty() || !o.final_chunk.empty();
  if (any_chunk && !o.budget.empty())
    return fail("--budget picks the slice sizes itself: give it without --mlp-chunk/--attn-chunk/--final-chunk");
  if (!o.vram_budget.empty() && (any_chunk || !o.budget.empty()))
    return fail("--vram-budget picks slices, weight residency and offload itself: give it without --budget and "
                "--mlp-chunk/--attn-chunk/--final-chunk");
  if (!o.vram_budget.empty() && builtin)
    return fail("--vram-budget needs --model or --preset (the built-in demonstration compares fixed stock and "
                "sliced plans)");

  // ---- flags ----
  auto steps = parse_int("--steps", o.steps, 1, sample::kFlowTimesteps);
  if (!steps.ok()) return fail(steps.error());
  auto cfg_scale = parse_double("--cfg", o.cfg);
  if (!cfg_scale.ok()) return fail(cfg_scale.error());
  auto seed = parse_u64("--seed", o.seed);
  if (!seed.ok()) return fail(seed.error());
  auto wseed = parse_u64("--weights-seed", o.weights_seed);
  if (!wseed.ok()) return fail(wseed.error());
  auto frames = parse_int("--frames", o.frames, 1, 100000);
  if (!frames.ok()) return fail(frames.error());
  auto width = parse_int("--width", o.width, 32, 65536);
  if (!width.ok()) return fail(width.error());
  auto height = parse_int("--height", o.height, 32, 65536);
  if (!height.ok()) return fail(height.error());
  exec::PlanKnobs knobs;
  if (!o.mlp_chunk.empty()) {
    auto v = parse_int("--mlp-chunk", o.mlp_chunk, 0, int64_t{1} << 40);
    if (!v.ok()) return fail(v.error());
    knobs.mlp_chunk_tokens = *v;
  }
  if (!o.attn_chunk.empty()) {
    auto v = parse_int("--attn-chunk", o.attn_chunk, 0, int64_t{1} << 40);
    if (!v.ok()) return fail(v.error());
    knobs.attn_chunk_tokens = *v;
  }
  if (!o.final_chunk.empty()) {
    auto v = parse_int("--final-chunk", o.final_chunk, 0, int64_t{1} << 40);
    if (!v.ok()) return fail(v.error());
    knobs.final_chunk_tokens = *v;
  }
  if (!o.kv_tile.empty()) {
    auto v = parse_int("--kv-tile", o.kv_tile, 1, int64_t{1} << 30);
    if (!v.ok()) return fail(v.error());
    knobs.kv_tile = *v;
  }
  uint64_t budget = 0;
  if (!o.budget.empty()) {
    auto b = exec::parse_byte_size(o.budget);
    if (!b.ok()) return fail(b.error());
    if (*b == 0) return fail("--budget must be positive");
    budget = *b;
  }
  if (!o.threads.empty()) {
    auto t = parse_int("--threads", o.threads, 0, 4096);
    if (!t.ok()) return fail(t.error());
    set_num_threads(static_cast<int>(*t));
  }
  if (!o.output.empty() && o.output == o.json) return fail("-o and --json name the same file");

  // ---- weights ----
  std::unique_ptr<h3::H3TensorSource> source;
  std::string preset_name = builtin ? "tiny" : o.preset;
  if (!o.model.empty()) {
    auto f = h3::open_h3_checkpoint(o.model);
    if (!f.ok()) return fail(f.error());
    source = std::move(f).value();
  } else {
    auto cfg = h3::h3_preset(preset_name);
    if (!cfg.ok()) return fail(cfg.error());
    source = std::make_unique<h3::H3SyntheticSource>(*cfg, *wseed);
  }
  const h3::H3Config& cfg = source->cfg();

  // ---- text states ----
  std::unique_ptr<SafetensorsReader> text_file;
  TensorView text_view, negative_view;
  std::vector<float> standin_pos, standin_neg;
  const bool guided = !sample::cfg_is_one(*cfg_scale);
  int64_t L = 0;
  if (!o.text.empty()) {
    auto f = SafetensorsReader::open(o.text);
    if (!f.ok()) return fail(f.error());
    text_file = std::move(f).value();
    const SafetensorsEntry* e = text_file->find("text");
    if (!e) return fail(o.text + " has no tensor \"text\" (text states [L, text_dim])");
    text_view = text_file->view(*e);
    if (const SafetensorsEntry* n = text_file->find("negative")) negative_view = text_file->view(*n);
    // ComfyUI's cross_attn is [1, L, text_dim]: a leading batch of one is accepted.
    for (TensorView* v : {&text_view, &negative_view})
      if (!v->empty() && v->ndim == 3 && v->size(0) == 1) *v = TensorView(v->data, v->dtype, {v->size(1), v->size(2)});
    if (text_view.ndim != 2 || (!negative_view.empty() && negative_view.ndim != 2))
      return fail(o.text + ": \"text\" and \"negative\" must be [L, text_dim] (or [1, L, text_dim])");
    L = text_view.size(0);
    if (!o.text_tokens.empty()) {
      auto l = parse_int("--text-tokens", o.text_tokens, 1, 10000000);
      if (!l.ok()) return fail(l.error());
      if (*l != L)
        return fail("--text-tokens " + std::to_string(*l) + " disagrees with " + o.text + " (" + std::to_string(L) +
                    " tokens); leave --text-tokens out");
    }
  } else {
    auto l = parse_int("--text-tokens", o.text_tokens.empty() ? "32" : o.text_tokens, 1, 10000000);
    if (!l.ok()) return fail(l.error());
    L = *l;
    standin_pos = sample::standin_text_states(*seed, 0, L, cfg.text_dim);
    text_view = TensorView(standin_pos.data(), DType::f32, {L, cfg.text_dim});
    if (guided) {
      standin_neg = sample::standin_text_states(*seed, 1, L, cfg.text_dim);
      negative_view = TensorView(standin_neg.data(), DType::f32, {L, cfg.text_dim});
    }
  }

  // ---- geometry, conditioning ----
  auto geom = h3::clip_geometry(*frames, *width, *height, L);
  if (!geom.ok()) return fail(geom.error());
  h3::Conditioning cond;
  cond.geometry = *geom;
  for (const std::string& k : o.keyframes) {
    h3::Keyframe kf;
    if (Status s = load_keyframe(k, cfg, *geom, kf); !s.ok()) return fail(s.error());
    cond.keyframes.push_back(std::move(kf));
  }
  for (const std::string& r : o.refs) {
    h3::Reference ref;
    if (Status s = load_reference(r, cfg, ref); !s.ok()) return fail(s.error());
    cond.refs.push_back(std::move(ref));
  }
  auto sched = sample::make_simple_schedule(*steps, cond.shift_video, cond.shift_audio);
  if (!sched.ok()) return fail(sched.error());

  // ---- the backend (its default kv_tile is a numerics input of the plans) ----
  auto backend = make_backend(o.device);
  if (!backend.ok()) return fail(backend.error());
  if (o.kv_tile.empty()) knobs.kv_tile = (*backend)->default_kv_tile();

  // ---- --vram-budget: one total for weights, tables, activations and workspace ----
  // Planned for the longer of the two prompts (the negative one may have another L, so
  // another S); every buffer grows with S at fixed slices, so the same slices, offload
  // choices and weight residency fit the shorter prompt too.
  exec::Residency residency;
  std::optional<exec::BudgetPlan> vram_plan;
  if (!o.vram_budget.empty()) {
    auto bytes = exec::parse_byte_size(o.vram_budget);
    if (!bytes.ok()) return fail(bytes.error());
    h3::Conditioning widest = cond;
    if (guided && !negative_view.empty() && negative_view.size(0) > L) {
      widest.geometry.text_tokens = negative_view.size(0);
      widest.text_token_tags.clear();
    }
    exec::BudgetOptions bo;
    bo.kv_tile = knobs.kv_tile;
    bo.workspace_bytes = (*backend)->workspace_bytes();
    auto rows = exec::modulation_rows_for(cfg, cond, sched->video);
    if (!rows.ok()) return fail(rows.error());
    bo.modulation_rows = *rows;
    auto bp = exec::plan_total_budget(cfg, widest, *bytes, bo);
    if (!bp.ok()) return fail(bp.error());
    knobs.attn_chunk_tokens = bp->activations.attn_slice;
    knobs.mlp_chunk_tokens = bp->activations.mlp_slice;
    knobs.final_chunk_tokens = bp->activations.final_slice;
    knobs.kv_offload = bp->kv_offload;
    knobs.residual_offload = bp->residual_offload;
    knobs.kv_chunk_rows = bp->kv_chunk;
    residency.resident_blocks = bp->resident_blocks;
    residency.slots = bp->prefetch ? 2 : 1;
    vram_plan = std::move(bp).value();
  }

  // ---- the runs: their plans are made (and checked against a budget) before any work ----
  std::vector<RunSpec> runs;
  sample::GenerateRequest base;
  base.cond = cond;
  base.text = text_view;
  base.negative = negative_view;
  base.sigmas = sched->video;
  base.cfg = *cfg_scale;
  base.seed = *seed;
  base.knobs = knobs;
  base.budget_bytes = budget;
  if (builtin) {
    RunSpec stock{"stock", base};
    stock.req.knobs = exec::PlanKnobs{};
    stock.req.knobs.kv_tile = knobs.kv_tile;
    stock.req.budget_bytes = 0;
    RunSpec sliced{"sliced", base};
    if (!any_chunk && budget == 0) {
      // The demonstration's slices: 128 rows, which leaves a short last slice (S = 554
      // at the default clip: 4 x 128 + 42).
      sliced.req.knobs.mlp_chunk_tokens = 128;
      sliced.req.knobs.attn_chunk_tokens = 128;
      sliced.req.knobs.final_chunk_tokens = 128;
    }
    runs.push_back(std::move(stock));
    runs.push_back(std::move(sliced));
  } else {
    runs.push_back(RunSpec{"run", base});
  }
  std::vector<sample::GeneratePlans> plans;
  for (const RunSpec& r : runs) {
    auto p = sample::plan_generation(cfg, r.req);
    if (!p.ok()) return fail(p.error());
    plans.push_back(std::move(p).value());
  }

  // ---- engine ----
  Progress* progress = nullptr;  // the current run's display
  exec::EngineOptions eopts;
  eopts.residency = residency;
  eopts.eval = [&progress](const std::string& name, int64_t, const TensorView&) {
    if (progress && name == "block.mlp") progress->advance();
  };
  auto engine = exec::Engine::create(*source, **backend, eopts);
  if (!engine.ok()) return fail(engine.error());

  // ---- header ----
  const h3::ClipGeometry& g = *geom;
  std::printf("model: %s%s\n", source->describe().c_str(),
              builtin ? " (built-in: no --model/--preset given; tiny H3-shaped model, synthetic weights)" : "");
  std::printf("backend: %s; clip: %lld frames %lldx%lld, L %lld -> latent T %lld, %lldx%lld, audio A %lld; S %lld\n",
              (*backend)->name().c_str(), static_cast<long long>(g.frames), static_cast<long long>(g.width),
              static_cast<long long>(g.height), static_cast<long long>(L), static_cast<long long>(g.T),
              static_cast<long long>(g.Hl), static_cast<long long>(g.Wl), static_cast<long long>(g.A),
              static_cast<long long>(plans[0].positive.sizes.S));
  std::printf("schedule: simple, %lld steps, euler, cfg %g%s, seed %llu\n", static_cast<long long>(*steps), *cfg_scale,
              guided ? " (negative prompt)" : " (one forward per step)", static_cast<unsigned long long>(*seed));
  std::printf("  video sigma (shift %g): %s\n", cond.shift_video, sample::format_sigmas(sched->video).c_str());
  std::printf("  audio sigma (shift %g): %s\n", cond.shift_audio, sample::format_sigmas(sched->audio).c_str());
  if (vram_plan) std::printf("vram %s\n", vram_plan->describe().c_str());
  for (size_t i = 0; i < runs.size(); ++i)
    std::printf("plan%s%s: %s\n", runs.size() > 1 ? " " : "", runs.size() > 1 ? runs[i].label.c_str() : "",
                plans[i].positive.describe().c_str());
  std::fflush(stdout);

  // ---- run ----
  std::vector<sample::GenerateResult> results;
  for (size_t i = 0; i < runs.size(); ++i) {
    const int64_t forwards = *steps * (guided ? 2 : 1);
    std::unique_ptr<Progress> bar;
    if (!o.quiet) bar = std::make_unique<Progress>(runs[i].label, "block passes", forwards * cfg.num_layers);
    progress = bar.get();
    sample::GenerateHooks hooks;
    hooks.on_forward_begin = [&](int64_t step, sample::Prompt p, float sigma) {
      if (!progress) return;
      char buf[96];
      std::snprintf(buf, sizeof buf, "step %lld/%lld sigma %.6g%s", static_cast<long long>(step + 1),
                    static_cast<long long>(*steps), static_cast<double>(sigma),
                    p == sample::Prompt::negative ? " (negative)" : "");
      progress->set_detail(buf);
    };
    auto res = sample::generate(**engine, runs[i].req, hooks);
    if (bar) bar->finish();
    progress = nullptr;
    if (!res.ok()) return fail(res.error());
    std::printf("%s\n", generate_status_line(runs[i].label, *res).c_str());
    if (vram_plan) {
      const VramUse u = vram_use(*res);
      std::printf("vram: LayerStream device peak %s of the %s budget (predicted %s); streamed block weights %s "
                  "over %zu forwards\n",
                  format_bytes(u.peak).c_str(), format_bytes(vram_plan->budget_bytes).c_str(),
                  format_bytes(vram_plan->predicted_peak_bytes).c_str(), format_bytes(u.weight_copies).c_str(),
                  res->forwards.size());
    }
    std::fflush(stdout);
    results.push_back(std::move(res).value());
  }

  // ---- built-in demonstration: memory saved and the byte comparison ----
  bool identical = true;
  nlohmann::json comparison;
  if (builtin) {
    const sample::GenerateResult& a = results[0];
    const sample::GenerateResult& b = results[1];
    const RunPeaks pa = run_peaks(a), pb = run_peaks(b);
    const double saved = pa.measured > 0 ? 100.0 * (1.0 - static_cast<double>(pb.measured) / static_cast<double>(pa.measured)) : 0.0;
    std::printf("memory: stock plan activation peak %s, sliced plan %s (measured): %s less (%.1f %%)\n",
                format_bytes(pa.measured).c_str(), format_bytes(pb.measured).c_str(),
                format_bytes(pa.measured > pb.measured ? pa.measured - pb.measured : 0).c_str(), saved);
    const bool same_v = same_bytes(a.video, b.video), same_a = same_bytes(a.audio, b.audio);
    identical = same_v && same_a;
    const std::string fp_v = hex64(fnv1a64(b.video.data(), b.video.size() * 4));
    const std::string fp_a = hex64(fnv1a64(b.audio.data(), b.audio.size() * 4));
    if (identical) {
      std::printf("byte-compare stock vs sliced: identical (video %zu B fnv1a64 %s, audio %zu B fnv1a64 %s)\n",
                  b.video.size() * 4, fp_v.c_str(), b.audio.size() * 4, fp_a.c_str());
    } else {
      std::printf("byte-compare stock vs sliced: DIFFERENT (video first difference: %s; audio first difference: %s)\n",
                  first_difference(a.video, b.video).c_str(), first_difference(a.audio, b.audio).c_str());
    }
    comparison = {{"identical", identical},
                  {"video_identical", same_v},
                  {"audio_identical", same_a},
                  {"stock_measured_peak_bytes", pa.measured},
                  {"sliced_measured_peak_bytes", pb.measured},
                  {"saved_percent", saved}};
  }

  // ---- outputs ----
  const sample::GenerateResult& out = results.back();
  if (!o.output.empty()) {
    std::map<std::string, std::string> meta{
        {"format", "layerstream-latents"},
        {"producer", "layerstream generate"},
        {"model", source->describe()},
        {"steps", std::to_string(*steps)},
        {"cfg", o.cfg},
        {"seed", std::to_string(*seed)},
        {"sigmas", sample::format_sigmas(sched->video)},
        {"plan", out.plan.describe()},
        {"frames", std::to_string(g.frames)},
        {"width", std::to_string(g.width)},
        {"height", std::to_string(g.height)},
        {"text_tokens", std::to_string(L)},
    };
    std::vector<NamedTensor> tensors{
        {"video", TensorView(const_cast<float*>(out.video.data()), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})},
        {"audio", TensorView(const_cast<float*>(out.audio.data()), DType::f32, {cfg.audio_latents_dim, 2, g.A})},
    };
    if (!identical) {
      std::fprintf(stderr, "%s: not writing %s: the stock and sliced outputs differ\n", kCmd, o.output.c_str());
    } else if (Status s = write_safetensors(o.output, tensors, meta); !s.ok()) {
      return fail(s.error());
    } else {
      std::printf("wrote %s (video fp32 [%lld, %lld, %lld, %lld], audio fp32 [%lld, 2, %lld])\n", o.output.c_str(),
                  static_cast<long long>(cfg.latents_dim), static_cast<long long>(g.T), static_cast<long long>(g.Hl),
                  static_cast<long long>(g.Wl), static_cast<long long>(cfg.audio_latents_dim),
                  static_cast<long long>(g.A));
    }
  }
  if (!o.json.empty()) {
    nlohmann::json j;
    j["command"] = "generate";
    j["model"] = source->describe();
    j["builtin"] = builtin;
    j["backend"] = (*backend)->name();
    j["config"] = {{"hidden", cfg.hidden}, {"num_layers", cfg.num_layers}, {"heads", cfg.heads},
                   {"head_dim", cfg.head_dim}, {"ffn", cfg.ffn}, {"text_dim", cfg.text_dim}};
    j["clip"] = {{"frames", g.frames}, {"width", g.width}, {"height", g.height}, {"T", g.T}, {"Hl", g.Hl},
                 {"Wl", g.Wl}, {"A", g.A}, {"text_tokens", L}, {"S", plans[0].positive.sizes.S},
                 {"keyframes", cond.keyframes.size()}, {"references", cond.refs.size()}};
    j["schedule"] = {{"scheduler", "simple"}, {"sampler", "euler"}, {"steps", *steps}, {"shift_video", cond.shift_video},
                     {"shift_audio", cond.shift_audio}, {"video_sigmas", sched->video}, {"audio_sigmas", sched->audio}};
    j["cfg"] = *cfg_scale;
    j["seed"] = *seed;
    nlohmann::json rj = nlohmann::json::array();
    for (size_t i = 0; i < runs.size(); ++i) rj.push_back(run_json(runs[i].label, results[i]));
    j["runs"] = rj;
    if (builtin) j["comparison"] = comparison;
    if (vram_plan) {
      const VramUse u = vram_use(results.back());
      j["vram_budget"] = budget_plan_json(*vram_plan);
      j["vram_budget"]["device_peak_bytes"] = u.peak;
      j["vram_budget"]["weight_copy_bytes"] = u.weight_copies;
    }
    if (!o.output.empty() && identical) j["output"] = o.output;
    if (Status s = write_json_file(o.json, j); !s.ok()) return fail(s.error());
  }
  return identical ? 0 : 1;
}

CommandRun setup_generate(CLI::App& sub) {
  auto o = std::make_shared<GenerateOptions>();
  sub.add_option("--model", o->model, "H3 checkpoint (.safetensors)");
  sub.add_option("--preset", o->preset, "synthetic weights of a preset: tiny | small | h3");
  sub.add_option("--weights-seed", o->weights_seed, "seed of the synthetic weights (--preset / built-in; default 0)");
  sub.add_option("--steps", o->steps, "sampling steps (simple schedule; default 4)");
  sub.add_option("--cfg", o->cfg, "guidance scale; 1 = one forward per step, else a negative prompt is used (default 1)");
  sub.add_option("--seed", o->seed, "sampler seed: noise and stand-in text (default 0)");
  sub.add_option("--frames", o->frames, "pixel frames, snapped up to 17j+5 (default 22)");
  sub.add_option("--width", o->width, "width in pixels, multiple of 32 (default 256)");
  sub.add_option("--height", o->height, "height in pixels, multiple of 32 (default 256)");
  sub.add_option("--text-tokens", o->text_tokens, "tokens of the seeded stand-in text (default 32; not with --text)");
  sub.add_option("--text", o->text,
                 "text-encoder states: safetensors with \"text\" [L, text_dim] and optional \"negative\" [L', text_dim]");
  sub.add_option("--keyframe", o->keyframes,
                 "keyframe latent FILE[@FRAME|@last]: \"video\" [C, T, Hl, Wl] (+ optional \"audio\" [C, 2, A])");
  sub.add_option("--ref", o->refs, "reference latent FILE: \"video\" and/or \"audio\"");
  sub.add_option("--mlp-chunk", o->mlp_chunk, "rows per MLP / patch-embedding slice (0 = all)");
  sub.add_option("--attn-chunk", o->attn_chunk, "rows per attention slice, two-pass (0 = stock attention)");
  sub.add_option("--final-chunk", o->final_chunk, "rows per final-layer slice (0 = all)");
  sub.add_option("--kv-tile", o->kv_tile, "keys per attention tile: a numerics setting (default: the device's, 1024 on the CPU, 8192 with CUDA + cuDNN)");
  sub.add_option("--budget", o->budget, "activation memory budget (512M, 3G, 3.5GiB): picks the largest slices that fit");
  sub.add_option("--vram-budget", o->vram_budget,
                 "ONE device budget for everything (weights, AdaLN tables, activations, workspace): the planner "
                 "keeps what fits resident, streams the rest of the blocks, offloads K/V and the residual only when "
                 "nothing else fits; refused before any work when too small, naming the minimum (--model/--preset)");
  sub.add_option("--device", o->device, "cpu | cuda | cuda:N (default cpu)");
  sub.add_option("--threads", o->threads, "CPU threads (0 = all cores)");
  sub.add_option("--json", o->json, "write the full run report as JSON");
  sub.add_option("-o,--output", o->output, "output latents (.safetensors); required with --model/--preset");
  sub.add_flag("-q,--quiet", o->quiet, "no progress display");
  return [o]() { return run_generate(*o); };
}

LS_REGISTER_COMMAND(g_generate, "generate",
                    "sample a clip (simple schedule, flow Euler, CFG) and write its latents; with no --model/--preset, "
                    "a built-in demonstration that stock and sliced plans give identical bytes",
                    setup_generate);

}  // namespace
}  // namespace ls::tools
