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

#include "api/session.h"
#include "core/arena.h"  // format_bytes
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "sample/generate.h"
#include "sample/schedule.h"
#include "tools/command.h"
#include "tools/memory_plot.h"
#include "tools/progress.h"
#include "tools/report.h"
#include "tools/cli_util.h"

namespace ls::tools {
namespace {

constexpr const char* kCmd = "layerstream generate";

// Numbers are taken as text and parsed by the one strict parser (tools/cli_util.h), so
// that a bad value is exit code 2 with a message naming the flag and its range.
struct GenerateOptions {
  LoraFlags lora;  // --lora FILE[:STRENGTH] ..., --lora-dtype
  WeightFlags wflags;  // --format, --precision
  NumericsFlags numerics;  // --attention, --gemm-f32 (+ the developer variables)
  FlagText model, preset, weights_seed;
  FlagText steps, cfg, seed;
  FlagText frames, width, height, text_tokens;
  FlagText text;
  std::vector<std::string> keyframes, refs;
  FlagText mlp_chunk, attn_chunk, final_chunk, kv_tile, budget, vram_budget;
  FlagText device, threads;
  FlagText devices;  // --devices: sequence-parallel ranks (docs/multi-gpu.md)
  FlagText json, output, memory_plot;
  bool quiet = false, allow_nonfinite = false;
};

int fail(const Error& e) { return report_error(kCmd, e); }
int fail(const std::string& msg) { return fail(Error{ErrorCode::invalid_argument, msg}); }

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
  // ---- flags: every refusal here is a usage error (exit 2), before any file is opened ----
  const bool builtin = !o.model.given() && !o.preset.given();
  if (o.model.given() && o.preset.given()) return fail("give --model or --preset, not both");
  if (!builtin && !o.output.given()) return fail("-o OUT.safetensors is required with --model or --preset");
  if (o.weights_seed.given() && o.model.given())
    return fail("--weights-seed has no effect with --model (a file has its own weights): it goes with --preset or "
                "the built-in demonstration");
  if (o.text_tokens.given() && o.text.given())
    return fail("--text-tokens has no effect with --text (the file's \"text\" gives L): leave it out");
  const bool any_chunk = o.mlp_chunk.given() || o.attn_chunk.given() || o.final_chunk.given();
  // The memory flags: one request, the library's one validation (api::resolve_memory).
  api::MemoryRequest memory_request;
  MemoryFlags memory_flags;
  memory_flags.vram_budget = &o.vram_budget, memory_flags.budget = &o.budget;
  memory_flags.mlp_chunk = &o.mlp_chunk, memory_flags.attn_chunk = &o.attn_chunk;
  memory_flags.final_chunk = &o.final_chunk;
  if (auto m = memory_from_flags(memory_flags, &memory_request); !m.ok()) return fail(m.error().message);
  if (o.vram_budget.given() && builtin)
    return fail("--vram-budget needs --model or --preset (the built-in demonstration compares fixed stock and "
                "sliced plans)");

  auto steps = flag_int(o.steps, range::steps, 4);
  auto seed_i = flag_int(o.seed, range::seed, 0);
  auto wseed_i = flag_int(o.weights_seed, range::seed, 0);
  auto frames = flag_int(o.frames, range::frames, 22);
  auto width = flag_int(o.width, range::width, 256);
  auto height = flag_int(o.height, range::height, 256);
  auto text_tokens = flag_int(o.text_tokens, range::text_tokens, 32);
  auto mlp = flag_int(o.mlp_chunk, range::chunk, 0);
  auto attn = flag_int(o.attn_chunk, range::chunk, 0);
  auto fin = flag_int(o.final_chunk, range::chunk, 0);
  auto kv = flag_int(o.kv_tile, range::kv_tile, 1);  // not given: the device's (below)
  auto threads = flag_int(o.threads, range::threads, 0);
  for (const auto* e : {&steps, &seed_i, &wseed_i, &frames, &width, &height, &text_tokens, &mlp, &attn, &fin, &kv, &threads})
    if (!e->ok()) return fail(e->error());
  auto cfg_scale = flag_float(o.cfg, range::cfg, 1.0);
  if (!cfg_scale.ok()) return fail(cfg_scale.error());
  auto budget_b = flag_size(o.budget, range::budget, 0);
  if (!budget_b.ok()) return fail(budget_b.error());
  auto vram_b = flag_size(o.vram_budget, range::budget, 0);
  if (!vram_b.ok()) return fail(vram_b.error());
  const uint64_t budget = *budget_b;
  const uint64_t seed = static_cast<uint64_t>(*seed_i), wseed = static_cast<uint64_t>(*wseed_i);
  exec::PlanKnobs knobs;
  knobs.mlp_chunk_tokens = *mlp;
  knobs.attn_chunk_tokens = *attn;
  knobs.final_chunk_tokens = *fin;
  knobs.kv_tile = *kv;
  if (o.threads.given()) set_num_threads(static_cast<int>(*threads));
  std::vector<std::pair<std::string, std::string>> outputs;
  for (const FlagText* f : {&o.output, &o.json, &o.memory_plot})
    if (f->given()) outputs.emplace_back(f->name == "--output" ? "-o" : f->name, f->text);
  if (Status s = check_output_paths(outputs); !s.ok()) return fail(s.error());

  // ---- the backend (its default kv_tile is a numerics input of the plans) ----
  // The chain (backend, weights, budget -> residency + knobs, engine) is api::Session's.
  // Numerics (every bit-changing setting): flags, then developer variables, resolved by
  // the backend; printed, and stored in the report and the output file.
  auto nc = numerics_from_flags_and_env(kCmd, o.numerics, o.kv_tile.given() ? *kv : 0);
  if (!nc.ok()) return fail(nc.error());
  // --devices: one backend per sequence-parallel rank (docs/multi-gpu.md).
  std::vector<std::string> rank_devices;
  if (o.devices.given()) {
    if (o.device.given()) return fail("--device and --devices are exclusive: --devices lists every rank's device");
    auto d = parse_devices("--devices", o.devices.text);
    if (!d.ok()) return fail(d.error());
    rank_devices = std::move(*d);
  } else {
    rank_devices = {o.device.given() ? o.device.text : "cpu"};
  }
  auto opened = api::Session::open_backends(rank_devices, nc->numerics, nc->diagnostics);
  if (!opened.ok()) return fail(opened.error());
  api::Session& session = **opened;
  if (Status s = api::check_memory_device(memory_request, session.device_is_cpu(), api::kFlagNames); !s.ok())
    return fail(s.message());
  if (!o.kv_tile.given()) knobs.kv_tile = 0;  // the device's (Session::resolve_kv_tile)

  // ---- weights ----
  std::string preset_name = builtin ? "tiny" : o.preset.text;
  api::WeightsSpec weights;
  if (o.model.given()) {
    weights.model_path = o.model.text;
  } else {
    weights.preset = preset_name;
    weights.weights_seed = wseed;
  }
  if (Status ws = apply_weight_flags(o.lora, o.wflags, o.model.given(), weights); !ws.ok()) return fail(ws.message());
  if (Status s = session.load_weights(weights); !s.ok()) return fail(s.error());
  // After the weights: attention auto resolves per model (Session::load_weights), so this
  // line names the algorithm that runs.
  std::printf("[LayerStream] numerics: %s\n", describe(session.backend().numerics()).c_str());
  const h3::H3TensorSource* source = &session.source();
  const h3::H3Config& cfg = session.config();

  // ---- text states ----
  std::unique_ptr<SafetensorsReader> text_file;
  TensorView text_view, negative_view;
  std::vector<float> standin_pos, standin_neg;
  const bool guided = !sample::cfg_is_one(*cfg_scale);
  int64_t L = 0;
  if (o.text.given()) {
    auto f = SafetensorsReader::open(o.text.text);
    if (!f.ok()) return fail(f.error());
    text_file = std::move(f).value();
    const SafetensorsEntry* e = text_file->find("text");
    if (!e) return fail(Error{ErrorCode::invalid_file, o.text.text + " has no tensor \"text\" (text states [L, text_dim])"});
    text_view = text_file->view(*e);
    if (const SafetensorsEntry* n = text_file->find("negative")) negative_view = text_file->view(*n);
    // ComfyUI's cross_attn is [1, L, text_dim]: a leading batch of one is accepted.
    for (TensorView* v : {&text_view, &negative_view})
      if (!v->empty() && v->ndim == 3 && v->size(0) == 1) *v = TensorView(v->data, v->dtype, {v->size(1), v->size(2)});
    if (text_view.ndim != 2 || (!negative_view.empty() && negative_view.ndim != 2))
      return fail(Error{ErrorCode::invalid_file,
                        o.text.text + ": \"text\" and \"negative\" must be [L, text_dim] (or [1, L, text_dim])"});
    L = text_view.size(0);
  } else {
    L = *text_tokens;
    standin_pos = sample::standin_text_states(seed, 0, L, cfg.text_dim);
    text_view = TensorView(standin_pos.data(), DType::f32, {L, cfg.text_dim});
    if (guided) {
      standin_neg = sample::standin_text_states(seed, 1, L, cfg.text_dim);
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

  // ---- memory: --vram-budget (one total for weights, tables, activations and
  // workspace, planned for the longer prompt), --budget, or the slice flags ----
  sample::GenerateRequest base;
  base.cond = cond;
  base.text = text_view;
  base.negative = negative_view;
  base.sigmas = sched->video;
  base.cfg = *cfg_scale;
  base.seed = seed;
  api::MemorySpec memory;
  memory.mode = o.vram_budget.given() ? api::MemoryMode::total_budget
                : budget > 0          ? api::MemoryMode::activation_budget
                                      : api::MemoryMode::knobs;
  memory.knobs = knobs;
  memory.activation_budget = budget;
  memory.total_budget = *vram_b;
  auto run_plan = session.plan_sampling(base, memory);
  if (!run_plan.ok()) return fail(run_plan.error());
  api::Session::apply(*run_plan, base);
  knobs = run_plan->knobs;
  const std::optional<exec::BudgetPlan>& vram_plan = run_plan->budget;

  // ---- the runs: their plans are made (and checked against a budget) before any work ----
  std::vector<RunSpec> runs;
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
    auto p = session.plan_generation(r.req);
    if (!p.ok()) return fail(p.error());
    plans.push_back(std::move(p).value());
  }

  // ---- engine ----
  Progress* progress = nullptr;  // the current run's display
  int64_t forwards_begun = 0;    // of the current run
  exec::EngineOptions eopts;
  eopts.check_finite = !o.allow_nonfinite;
  eopts.record_memory = o.memory_plot.given();
  // Blocks done in the current forward, placed after the forwards before it.
  eopts.progress = [&](int64_t done, int64_t) {
    if (progress) progress->set_done((forwards_begun - 1) * cfg.num_layers + done);
  };
  if (Status s = session.create_engine(*run_plan, eopts); !s.ok()) return fail(s.error());

  // ---- header ----
  const h3::ClipGeometry& g = *geom;
  std::printf("model: %s%s\n", source->describe().c_str(),
              builtin ? " (built-in: no --model/--preset given; tiny H3-shaped model, synthetic weights)" : "");
  std::printf("backend: %s; clip: %lld frames %lldx%lld, L %lld -> latent T %lld, %lldx%lld, audio A %lld; S %lld\n",
              session.backend().name().c_str(), static_cast<long long>(g.frames), static_cast<long long>(g.width),
              static_cast<long long>(g.height), static_cast<long long>(L), static_cast<long long>(g.T),
              static_cast<long long>(g.Hl), static_cast<long long>(g.Wl), static_cast<long long>(g.A),
              static_cast<long long>(plans[0].positive.sizes.S));
  std::printf("schedule: simple, %lld steps, euler, cfg %g%s, seed %llu\n", static_cast<long long>(*steps), *cfg_scale,
              guided ? " (negative prompt)" : " (one forward per step)", static_cast<unsigned long long>(seed));
  std::printf("  video sigma (shift %g): %s\n", cond.shift_video, sample::format_sigmas(sched->video).c_str());
  std::printf("  audio sigma (shift %g): %s\n", cond.shift_audio, sample::format_sigmas(sched->audio).c_str());
  if (vram_plan) std::printf("vram %s\n", vram_plan->describe().c_str());
  for (size_t i = 0; i < runs.size(); ++i)
    std::printf("plan%s%s: %s\n", runs.size() > 1 ? " " : "", runs.size() > 1 ? runs[i].label.c_str() : "",
                plans[i].positive.describe().c_str());
  std::fflush(stdout);

  // ---- run ----
  std::vector<sample::GenerateResult> results;
  int64_t nonfinite = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const int64_t forwards = *steps * (guided ? 2 : 1);
    std::unique_ptr<Progress> bar;
    if (!o.quiet) bar = std::make_unique<Progress>(runs[i].label, "block passes", forwards * cfg.num_layers);
    progress = bar.get();
    forwards_begun = 0;
    sample::GenerateHooks hooks;
    hooks.on_forward_begin = [&](int64_t step, sample::Prompt p, float sigma) {
      ++forwards_begun;
      if (!progress) return;
      progress->set_done((forwards_begun - 1) * cfg.num_layers);  // the forwards before this one are done
      char buf[96];
      std::snprintf(buf, sizeof buf, "step %lld/%lld sigma %.6g%s", static_cast<long long>(step + 1),
                    static_cast<long long>(*steps), static_cast<double>(sigma),
                    p == sample::Prompt::negative ? " (negative)" : "");
      progress->set_detail(buf);
    };
    auto res = session.generate(runs[i].req, hooks);
    progress = nullptr;
    if (!res.ok()) {
      if (bar) bar->abandon();
      Error e = res.error();
      if (e.code == ErrorCode::nonfinite)
      e.message += e.message.find("--allow-nonfinite") == std::string::npos
                       ? " (nothing written; --allow-nonfinite writes the output anyway)"
                       : " (nothing written)";
      return fail(e);
    }
    if (bar) bar->finish();
    // Non-finite latents: an error (exit 1, nothing written) unless --allow-nonfinite.
    const int64_t bad_v = count_nonfinite(res->video.data(), res->video.size());
    const int64_t bad_a = count_nonfinite(res->audio.data(), res->audio.size());
    nonfinite = std::max(nonfinite, bad_v + bad_a);
    if (bad_v + bad_a > 0) {
      const std::string what = std::to_string(bad_v + bad_a) + " non-finite values (NaN or inf) in the " +
                               runs[i].label + " latents (video " + std::to_string(bad_v) + " of " +
                               std::to_string(res->video.size()) + ", audio " + std::to_string(bad_a) + " of " +
                               std::to_string(res->audio.size()) + ")";
      if (!o.allow_nonfinite)
        return fail({ErrorCode::nonfinite, what + "; nothing written (--allow-nonfinite writes the output anyway)"});
      std::fprintf(stderr, "%s: warning: %s; written anyway (--allow-nonfinite)\n", kCmd, what.c_str());
    }
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
  if (o.output.given()) {
    // Only what determines the latents' bytes: the weights, the inputs and the numerics
    // settings. No plan, budget, residency or timing: files of different memory settings
    // are byte-identical (`cmp`); those go to the --json report.
    char cfg_text[32];
    std::snprintf(cfg_text, sizeof cfg_text, "%.15g", *cfg_scale);
    std::map<std::string, std::string> meta{
        {"format", "layerstream-latents"},
        {"producer", "layerstream generate"},
        {"model", source->describe()},
        {"steps", std::to_string(*steps)},
        {"cfg", cfg_text},
        {"seed", std::to_string(seed)},
        {"sigmas", sample::format_sigmas(sched->video)},
        {"frames", std::to_string(g.frames)},
        {"width", std::to_string(g.width)},
        {"height", std::to_string(g.height)},
        {"text_tokens", std::to_string(L)},
        {"kv_tile", std::to_string(out.plan.kv_tile)},
        {"backend", backend_kind(session.backend().name())},
        {"numerics", describe(session.backend().numerics())},
    };
    if (o.text.given()) meta["text"] = o.text.text;
    auto joined = [](const std::vector<std::string>& v) {
      std::string r;
      for (const auto& a : v) r += (r.empty() ? "" : ";") + a;
      return r;
    };
    if (!o.keyframes.empty()) meta["keyframes"] = joined(o.keyframes);
    if (!o.refs.empty()) meta["refs"] = joined(o.refs);
    std::vector<NamedTensor> tensors{
        {"video", TensorView(const_cast<float*>(out.video.data()), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})},
        {"audio", TensorView(const_cast<float*>(out.audio.data()), DType::f32, {cfg.audio_latents_dim, 2, g.A})},
    };
    if (!identical) {
      std::fprintf(stderr, "%s: not writing %s: the stock and sliced outputs differ\n", kCmd, o.output.text.c_str());
    } else if (Status s = write_safetensors(o.output.text, tensors, meta); !s.ok()) {
      return fail(s.error());
    } else {
      std::printf("wrote %s (video fp32 [%lld, %lld, %lld, %lld], audio fp32 [%lld, 2, %lld])\n", o.output.text.c_str(),
                  static_cast<long long>(cfg.latents_dim), static_cast<long long>(g.T), static_cast<long long>(g.Hl),
                  static_cast<long long>(g.Wl), static_cast<long long>(cfg.audio_latents_dim),
                  static_cast<long long>(g.A));
    }
  }
  if (o.memory_plot.given()) {
    MemoryPlotInput in;
    in.title = "generate, " + std::to_string(out.forwards.size()) + " forwards, S " + std::to_string(out.plan.sizes.S) +
               ", " + session.backend().name() +
               (vram_plan ? ", --vram-budget " + format_bytes(vram_plan->budget_bytes) : std::string());
    for (const sample::ForwardRecord& f : out.forwards)
      in.samples.insert(in.samples.end(), f.report.memory.begin(), f.report.memory.end());
    in.budget_bytes = vram_plan ? vram_plan->budget_bytes : 0;
    in.predicted_peak_bytes = vram_plan ? vram_plan->predicted_peak_bytes : 0;
    if (Status s = write_memory_plot(o.memory_plot.text, in); !s.ok()) return fail(s.error());
  }
  if (o.json.given()) {
    nlohmann::json j;
    j["command"] = "generate";
    j["version"] = version_json();
    j["numerics"] = session.backend().numerics();
    j["numerics_from_env"] = nc->from_env;
    j["nonfinite_values"] = nonfinite;
    j["model"] = source->describe();
    j["builtin"] = builtin;
    j["backend"] = session.backend().name();
    j["config"] = {{"hidden", cfg.hidden}, {"num_layers", cfg.num_layers}, {"heads", cfg.heads},
                   {"head_dim", cfg.head_dim}, {"ffn", cfg.ffn}, {"text_dim", cfg.text_dim}};
    j["clip"] = {{"frames", g.frames}, {"width", g.width}, {"height", g.height}, {"T", g.T}, {"Hl", g.Hl},
                 {"Wl", g.Wl}, {"A", g.A}, {"text_tokens", L}, {"S", plans[0].positive.sizes.S},
                 {"keyframes", cond.keyframes.size()}, {"references", cond.refs.size()}};
    j["schedule"] = {{"scheduler", "simple"}, {"sampler", "euler"}, {"steps", *steps}, {"shift_video", cond.shift_video},
                     {"shift_audio", cond.shift_audio}, {"video_sigmas", sched->video}, {"audio_sigmas", sched->audio}};
    j["cfg"] = *cfg_scale;
    j["seed"] = seed;
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
    if (o.output.given() && identical) j["output"] = o.output.text;
    if (Status s = write_json_file(o.json.text, j); !s.ok()) return fail(s.error());
  }
  return identical ? 0 : 1;
}

CommandRun setup_generate(CLI::App& sub) {
  auto o = std::make_shared<GenerateOptions>();
  add_text_flag(sub, "--model", o->model, "FILE", "H3 checkpoint (.safetensors)");
  add_text_flag(sub, "--preset", o->preset, "NAME", "synthetic weights of a preset: tiny | small | h3");
  add_int_flag(sub, "--weights-seed", o->weights_seed, range::seed,
               "seed of the synthetic weights (--preset / built-in; not with --model)", "0");
  add_int_flag(sub, "--steps", o->steps, range::steps, "sampling steps (simple schedule)", "4");
  add_float_flag(sub, "--cfg", o->cfg, range::cfg,
                 "guidance scale; 1 = one forward per step, else a negative prompt is used", "1");
  add_int_flag(sub, "--seed", o->seed, range::seed, "sampler seed: noise and stand-in text", "0");
  add_int_flag(sub, "--frames", o->frames, range::frames, "pixel frames, snapped up to 17j+5", "22");
  add_int_flag(sub, "--width", o->width, range::width, "width in pixels, a multiple of 32", "256");
  add_int_flag(sub, "--height", o->height, range::height, "height in pixels, a multiple of 32", "256");
  add_int_flag(sub, "--text-tokens", o->text_tokens, range::text_tokens,
               "tokens of the seeded stand-in text (not with --text)", "32");
  add_text_flag(sub, "--text", o->text, "FILE",
                "text-encoder states: safetensors with \"text\" [L, text_dim] and optional \"negative\" [L', text_dim]");
  sub.add_option("--keyframe", o->keyframes,
                 "keyframe latent FILE[@FRAME|@last]: \"video\" [C, T, Hl, Wl] (+ optional \"audio\" [C, 2, A])")
      ->type_name("FILE[@FRAME]");
  sub.add_option("--ref", o->refs, "reference latent FILE: \"video\" and/or \"audio\"")->type_name("FILE");
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
                "activation memory budget: picks the largest slices that fit (not with the chunk flags)");
  add_size_flag(sub, "--vram-budget", o->vram_budget, range::budget,
                "ONE device budget for everything (CUDA; weights, AdaLN tables, activations, workspace): the planner "
                "keeps what fits resident, streams the rest of the blocks, offloads K/V and the residual only when "
                "nothing else fits; refused before any work when too small, naming the minimum (--model/--preset)");
  add_text_flag(sub, "--device", o->device, "DEVICE", "cpu | cuda | cuda:N", "cpu");
  add_text_flag(sub, "--devices", o->devices, "LIST",
                "sequence parallel over several devices (one rank each, output bytes equal one device's): "
                "cuda:0,cuda:1,... or cpu*N (N in-process CPU ranks); the count must divide the model's heads; "
                "budgets are per device");
  add_int_flag(sub, "--threads", o->threads, range::threads, "CPU threads (0 = all cores)", "0");
  sub.add_flag("--allow-nonfinite", o->allow_nonfinite,
               "write the output even when it holds NaN or inf (a warning gives the count); without it such a run "
               "fails (exit 1) naming the first block and phase, and writes nothing");
  add_text_flag(sub, "--json", o->json, "FILE", "write the full run report as JSON (with the version)");
  add_text_flag(sub, "--memory-plot", o->memory_plot, "FILE.svg",
                "draw the device memory over every forward by phase and block (SVG)");
  add_text_flag(sub, "-o,--output", o->output, "FILE", "output latents (.safetensors); required with --model/--preset");
  sub.add_flag("-q,--quiet", o->quiet, "no progress display");
  return [o]() { return run_generate(*o); };
}

LS_REGISTER_COMMAND(g_generate, "generate",
                    "sample a clip (simple schedule, flow Euler, CFG) and write its latents; with no --model/--preset, "
                    "a built-in demonstration that stock and sliced plans give identical bytes",
                    setup_generate);

}  // namespace
}  // namespace ls::tools
