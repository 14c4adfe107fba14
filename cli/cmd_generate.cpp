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
#include "cli/command.h"
#include "cli/memory_plot.h"
#include "cli/progress.h"
#include "cli/report.h"
#include "cli/cli_util.h"
#include "cli/inputs.h"
#include "cli/interrupt.h"
#include "io/output_file.h"

namespace ls::cli {
namespace {

constexpr const char* kCmd = "layerstream generate";

// Numbers are taken as text and parsed by the one strict parser (cli/cli_util.h), so
// that a bad value is exit code 2 with a message naming the flag and its range.
struct GenerateOptions : RunFlags {
  FlagText steps, cfg;
  FlagText text;
  std::vector<std::string> refs;
  FlagText comfy_latents;  // --comfyui-latents PREFIX: PREFIX.video.latent + PREFIX.audio.latent
};

int fail(const Error& e) { return report_error(kCmd, e); }

Status load_keyframe(const std::string& arg, const h3::H3Config& cfg, const h3::ClipGeometry& g, h3::Keyframe& kf) {
  LS_ASSIGN_OR_RETURN(KeyframeArg ka, parse_keyframe_arg(arg));
  LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(ka.path));
  LS_TRY(load_generate_keyframe(*file, cfg, g, kf));
  std::optional<std::string> meta;
  if (auto it = file->metadata().find("pixel_frame"); it != file->metadata().end()) meta = it->second;
  LS_ASSIGN_OR_RETURN(kf.pixel_frame, keyframe_pixel_frame(ka, meta, g.frames));
  return {};
}

Status load_reference_file(const std::string& path, const h3::H3Config& cfg, h3::Reference& ref) {
  LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(path));
  return load_reference(*file, cfg, ref);
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

// ---- parse -> validate -> run -> report (issue 27 item 4) -----------------------------
// One GenerateRun carries the command from its parsed flags to its results; each step
// returns an Error whose code decides the exit (invalid_argument and out_of_budget: 2,
// the rest 1; cli/cli_util.h exit_code_for).

struct GenerateRun {
  explicit GenerateRun(const GenerateOptions& opts) : o(opts) {}
  const GenerateOptions& o;
  // parsed flags
  bool builtin = false, any_chunk = false, guided = false;
  int64_t steps = 4, frames = 22, width = 256, height = 256, text_tokens = 32, threads = 0, kv_tile = 1;
  uint64_t seed = 0, weights_seed = 0, budget = 0, vram_budget = 0;
  double cfg_scale = 1.0;
  exec::PlanKnobs knobs;
  NumericsChoice nc;
  api::MemoryRequest memory_request;  // the memory flags as the library's one request
  // the session and the run's inputs
  std::unique_ptr<api::Session> session;
  std::unique_ptr<SafetensorsReader> text_file;
  std::vector<float> standin_pos, standin_neg;
  TensorView text_view, negative_view;
  int64_t L = 0;
  h3::Conditioning cond;
  sample::Schedule sched;
  std::optional<api::RunPlan> run_plan;
  std::vector<RunSpec> runs;
  std::vector<sample::GeneratePlans> plans;
  // while running (the engine's progress callback reads these)
  Progress* progress = nullptr;
  int64_t forwards_begun = 0;
  // results
  std::vector<sample::GenerateResult> results;
  int64_t nonfinite = 0;
  bool identical = true;
  nlohmann::json comparison;

  const h3::H3Config& cfg() const { return session->config(); }
  const std::optional<exec::BudgetPlan>& vram_plan() const { return run_plan->budget; }
};

Error usage_error(const std::string& msg) { return {ErrorCode::invalid_argument, msg}; }

// Flag combinations: every refusal a usage error, before any number is read.
Status check_flag_combinations(const GenerateOptions& o, api::MemoryRequest* memory_request) {
  const bool builtin = !o.model.given() && !o.preset.given();
  if (o.model.given() && o.preset.given()) return usage_error("give --model or --preset, not both");
  if (!builtin && !o.output.given()) return usage_error("-o OUT.safetensors is required with --model or --preset");
  if (o.weights_seed.given() && o.model.given())
    return usage_error("--weights-seed has no effect with --model (a file has its own weights): it goes with --preset "
                       "or the built-in demonstration");
  if (o.text_tokens.given() && o.text.given())
    return usage_error("--text-tokens has no effect with --text (the file's \"text\" gives L): leave it out");
  // The memory flags: one request, the library's one validation (api::resolve_memory,
  // the same rules and messages at every door).
  MemoryFlags memory_flags;
  memory_flags.vram_budget = &o.vram_budget, memory_flags.budget = &o.budget;
  memory_flags.mlp_chunk = &o.mlp_chunk, memory_flags.attn_chunk = &o.attn_chunk;
  memory_flags.final_chunk = &o.final_chunk;
  if (auto m = memory_from_flags(memory_flags, memory_request); !m.ok()) return m.error();
  if (o.vram_budget.given() && builtin)
    return usage_error("--vram-budget needs --model or --preset (the built-in demonstration compares fixed stock and "
                       "sliced plans)");
  if (o.comfy_latents.given() && builtin)
    return usage_error("--comfyui-latents needs --model or --preset (the built-in demonstration writes no latents)");
  if (o.devices.given() && o.device.given())
    return usage_error("--device and --devices are exclusive: --devices lists every rank's device");
  return Status();
}

// The flags' numbers (the one strict parser, cli/cli_util.h).
Status parse_args(GenerateRun& r) {
  const GenerateOptions& o = r.o;
  r.builtin = !o.model.given() && !o.preset.given();
  r.any_chunk = o.mlp_chunk.given() || o.attn_chunk.given() || o.final_chunk.given();
  int64_t seed = 0, wseed = 0;
  LS_ASSIGN_OR_RETURN(r.steps, flag_int(o.steps, range::steps, 4));
  LS_ASSIGN_OR_RETURN(seed, flag_int(o.seed, range::seed, 0));
  LS_ASSIGN_OR_RETURN(wseed, flag_int(o.weights_seed, range::seed, 0));
  LS_ASSIGN_OR_RETURN(r.frames, flag_int(o.frames, range::frames, 22));
  LS_ASSIGN_OR_RETURN(r.width, flag_int(o.width, range::width, 256));
  LS_ASSIGN_OR_RETURN(r.height, flag_int(o.height, range::height, 256));
  LS_ASSIGN_OR_RETURN(r.text_tokens, flag_int(o.text_tokens, range::text_tokens, 32));
  LS_TRY(slice_knobs_from_flags(o, r.knobs, r.kv_tile));
  LS_ASSIGN_OR_RETURN(r.threads, flag_int(o.threads, range::threads, 0));
  LS_ASSIGN_OR_RETURN(r.cfg_scale, flag_float(o.cfg, range::cfg, 1.0));
  LS_ASSIGN_OR_RETURN(r.budget, flag_size(o.budget, range::budget, 0));
  LS_ASSIGN_OR_RETURN(r.vram_budget, flag_size(o.vram_budget, range::budget, 0));
  r.seed = static_cast<uint64_t>(seed), r.weights_seed = static_cast<uint64_t>(wseed);
  r.guided = !sample::cfg_is_one(r.cfg_scale);
  return Status();
}

// Every output path, and that none is another output or one of the input files.
Status check_outputs(const GenerateOptions& o) {
  std::vector<std::pair<std::string, std::string>> outputs;
  std::vector<std::pair<std::string, std::string>> inputs;  // an output naming one would replace it
  run_file_paths(o, outputs, inputs);
  if (o.comfy_latents.given()) {
    outputs.emplace_back("--comfyui-latents", o.comfy_latents.text + ".video.latent");
    outputs.emplace_back("--comfyui-latents", o.comfy_latents.text + ".audio.latent");
  }
  if (o.text.given()) inputs.emplace_back("--text", o.text.text);
  for (const std::string& r : o.refs) inputs.emplace_back("--ref", r);
  return check_output_paths(outputs, inputs);
}

// The backend(s) (its default kv_tile is a numerics input of the plans), then the
// weights. Numerics (every bit-changing setting): flags, then developer variables,
// resolved by the backend; printed, and stored in the report and the output file.
Status open_session(GenerateRun& r) {
  const GenerateOptions& o = r.o;
  LS_ASSIGN_OR_RETURN(r.nc, numerics_from_flags_and_env(kCmd, o.numerics, o.kv_tile.given() ? r.kv_tile : 0));
  LS_ASSIGN_OR_RETURN(const std::vector<std::string> devices, rank_devices(o));
  LS_ASSIGN_OR_RETURN(r.session, api::Session::open_backends(devices, r.nc.numerics, r.nc.diagnostics));
  LS_TRY(api::check_memory_device(r.memory_request, r.session->device_is_cpu(), api::kFlagNames));
  api::WeightsSpec weights;
  if (o.model.given()) {
    weights.model_path = o.model.text;
  } else {
    weights.preset = r.builtin ? "tiny" : o.preset.text;
    weights.weights_seed = r.weights_seed;
  }
  if (Status ws = apply_weight_flags(o.lora, o.wflags, o.model.given(), weights); !ws.ok())
    return usage_error(ws.message());
  LS_TRY(r.session->load_weights(weights));
  // After the weights: attention auto resolves per model (Session::load_weights), so this
  // line names the algorithm that runs.
  std::printf("[LayerStream] numerics: %s\n", describe(r.session->backend().numerics()).c_str());
  return Status();
}

// Text states: the --text file (views into it) or seeded stand-ins (a negative one too
// when guided).
Status load_text(GenerateRun& r) {
  const int64_t text_dim = r.cfg().text_dim;
  if (r.o.text.given()) {
    LS_ASSIGN_OR_RETURN(r.text_file, SafetensorsReader::open(r.o.text.text));
    LS_ASSIGN_OR_RETURN(TextViews tv, load_text_states(*r.text_file));
    r.text_view = tv.text, r.negative_view = tv.negative;
    r.L = r.text_view.size(0);
    return Status();
  }
  r.L = r.text_tokens;
  r.standin_pos = sample::standin_text_states(r.seed, 0, r.L, text_dim);
  r.text_view = TensorView(r.standin_pos.data(), DType::f32, {r.L, text_dim});
  if (r.guided) {
    r.standin_neg = sample::standin_text_states(r.seed, 1, r.L, text_dim);
    r.negative_view = TensorView(r.standin_neg.data(), DType::f32, {r.L, text_dim});
  }
  return Status();
}

// Geometry, keyframes, references and the schedule.
Status make_conditioning(GenerateRun& r) {
  LS_ASSIGN_OR_RETURN(const h3::ClipGeometry g, h3::clip_geometry(r.frames, r.width, r.height, r.L));
  r.cond.geometry = g;
  for (const std::string& k : r.o.keyframes) {
    h3::Keyframe kf;
    LS_TRY(load_keyframe(k, r.cfg(), g, kf));
    r.cond.keyframes.push_back(std::move(kf));
  }
  for (const std::string& path : r.o.refs) {
    h3::Reference ref;
    LS_TRY(load_reference_file(path, r.cfg(), ref));
    r.cond.refs.push_back(std::move(ref));
  }
  LS_ASSIGN_OR_RETURN(r.sched, sample::make_simple_schedule(r.steps, r.cond.shift_video, r.cond.shift_audio));
  return Status();
}

// Memory (--vram-budget: one total for weights, tables, activations and workspace,
// planned for the longer prompt; --budget; or the slice flags), then the runs and their
// plans: made (and checked against a budget) before any work.
Status plan_runs(GenerateRun& r) {
  sample::GenerateRequest base;
  base.cond = r.cond;
  base.text = r.text_view;
  base.negative = r.negative_view;
  base.sigmas = r.sched.video;
  base.cfg = r.cfg_scale;
  base.seed = r.seed;
  api::MemorySpec memory;
  memory.mode = r.o.vram_budget.given() ? api::MemoryMode::total_budget
                : r.budget > 0          ? api::MemoryMode::activation_budget
                                        : api::MemoryMode::knobs;
  memory.knobs = r.knobs;
  memory.activation_budget = r.budget;
  memory.total_budget = r.vram_budget;
  LS_ASSIGN_OR_RETURN(r.run_plan, r.session->plan_sampling(base, memory));
  api::Session::apply(*r.run_plan, base);
  r.knobs = r.run_plan->knobs;
  if (r.builtin) {
    RunSpec stock{"stock", base};
    stock.req.knobs = exec::PlanKnobs{};
    stock.req.knobs.kv_tile = r.knobs.kv_tile;
    stock.req.budget_bytes = 0;
    RunSpec sliced{"sliced", base};
    if (!r.any_chunk && r.budget == 0) {
      // The demonstration's slices: 128 rows, which leaves a short last slice (S = 554
      // at the default clip: 4 x 128 + 42).
      sliced.req.knobs.mlp_chunk_tokens = 128;
      sliced.req.knobs.attn_chunk_tokens = 128;
      sliced.req.knobs.final_chunk_tokens = 128;
    }
    r.runs.push_back(std::move(stock));
    r.runs.push_back(std::move(sliced));
  } else {
    r.runs.push_back(RunSpec{"run", base});
  }
  for (const RunSpec& run : r.runs) {
    LS_ASSIGN_OR_RETURN(sample::GeneratePlans p, r.session->plan_generation(run.req));
    r.plans.push_back(std::move(p));
  }
  return Status();
}

void print_header(const GenerateRun& r) {
  const h3::ClipGeometry& g = r.cond.geometry;
  std::printf("model: %s%s\n", r.session->source().describe().c_str(),
              r.builtin ? " (built-in: no --model/--preset given; tiny H3-shaped model, synthetic weights)" : "");
  std::printf("backend: %s; clip: %lld frames %lldx%lld, L %lld -> latent T %lld, %lldx%lld, audio A %lld; S %lld\n",
              r.session->backend().name().c_str(), static_cast<long long>(g.frames), static_cast<long long>(g.width),
              static_cast<long long>(g.height), static_cast<long long>(r.L), static_cast<long long>(g.T),
              static_cast<long long>(g.Hl), static_cast<long long>(g.Wl), static_cast<long long>(g.A),
              static_cast<long long>(r.plans[0].positive.sizes.S));
  std::printf("schedule: simple, %lld steps, euler, cfg %g%s, seed %llu\n", static_cast<long long>(r.steps),
              r.cfg_scale, r.guided ? " (negative prompt)" : " (one forward per step)",
              static_cast<unsigned long long>(r.seed));
  std::printf("  video sigma (shift %g): %s\n", r.cond.shift_video, sample::format_sigmas(r.sched.video).c_str());
  std::printf("  audio sigma (shift %g): %s\n", r.cond.shift_audio, sample::format_sigmas(r.sched.audio).c_str());
  if (r.vram_plan()) std::printf("vram %s\n", r.vram_plan()->describe().c_str());
  for (size_t i = 0; i < r.runs.size(); ++i)
    std::printf("plan%s%s: %s\n", r.runs.size() > 1 ? " " : "", r.runs.size() > 1 ? r.runs[i].label.c_str() : "",
                r.plans[i].positive.describe().c_str());
  std::fflush(stdout);
}

// One run (a whole sampling), its progress display, its non-finite check (an error,
// nothing written, unless --allow-nonfinite) and its status lines.
Status run_one(GenerateRun& r, const RunSpec& run) {
  const int64_t layers = r.cfg().num_layers;
  const int64_t forwards = r.steps * (r.guided ? 2 : 1);
  std::unique_ptr<Progress> bar;
  if (!r.o.quiet) bar = std::make_unique<Progress>(run.label, "block passes", forwards * layers);
  r.progress = bar.get();
  r.forwards_begun = 0;
  sample::GenerateHooks hooks;
  hooks.on_forward_begin = [&](int64_t step, sample::Prompt p, float sigma) {
    ++r.forwards_begun;
    if (!r.progress) return;
    r.progress->set_done((r.forwards_begun - 1) * layers);  // the forwards before this one are done
    char buf[96];
    std::snprintf(buf, sizeof buf, "step %lld/%lld sigma %.6g%s", static_cast<long long>(step + 1),
                  static_cast<long long>(r.steps), static_cast<double>(sigma),
                  p == sample::Prompt::negative ? " (negative)" : "");
    r.progress->set_detail(buf);
  };
  auto res = r.session->generate(run.req, hooks);
  r.progress = nullptr;
  if (!res.ok()) {
    if (bar) bar->abandon();
    return nothing_written(res.error());
  }
  if (bar) bar->finish();
  LS_ASSIGN_OR_RETURN(const int64_t nonfinite,
                      check_outputs_finite(kCmd, res->video, res->audio, run.label + " latents", r.o.allow_nonfinite));
  r.nonfinite = std::max(r.nonfinite, nonfinite);
  std::printf("%s\n", generate_status_line(run.label, *res).c_str());
  if (const auto& vp = r.vram_plan()) {
    const VramUse u = vram_use(*res);
    std::printf("vram: LayerStream device peak %s of the %s budget (predicted %s); streamed block weights %s "
                "over %zu forwards\n",
                format_bytes(u.peak).c_str(), format_bytes(vp->budget_bytes).c_str(),
                format_bytes(vp->predicted_peak_bytes).c_str(), format_bytes(u.weight_copies).c_str(),
                res->forwards.size());
  }
  std::fflush(stdout);
  r.results.push_back(std::move(res).value());
  return Status();
}

// The engine, then every run.
Status run_all(GenerateRun& r) {
  exec::EngineOptions eopts;
  eopts.check_finite = !r.o.allow_nonfinite;
  eopts.record_memory = r.o.memory_plot.given();
  // Blocks done in the current forward, placed after the forwards before it.
  const int64_t layers = r.cfg().num_layers;
  eopts.progress = [&r, layers](int64_t done, int64_t) {
    if (r.progress) r.progress->set_done((r.forwards_begun - 1) * layers + done);
  };
  LS_TRY(r.session->create_engine(*r.run_plan, eopts));
  print_header(r);
  for (const RunSpec& run : r.runs) LS_TRY(run_one(r, run));
  return Status();
}

// The built-in demonstration: memory saved and the byte comparison of the two runs.
void compare_builtin(GenerateRun& r) {
  const sample::GenerateResult& a = r.results[0];
  const sample::GenerateResult& b = r.results[1];
  const RunPeaks pa = run_peaks(a), pb = run_peaks(b);
  const double saved =
      pa.measured > 0 ? 100.0 * (1.0 - static_cast<double>(pb.measured) / static_cast<double>(pa.measured)) : 0.0;
  std::printf("memory: stock plan activation peak %s, sliced plan %s (measured): %s less (%.1f %%)\n",
              format_bytes(pa.measured).c_str(), format_bytes(pb.measured).c_str(),
              format_bytes(pa.measured > pb.measured ? pa.measured - pb.measured : 0).c_str(), saved);
  const bool same_v = same_bytes(a.video, b.video), same_a = same_bytes(a.audio, b.audio);
  r.identical = same_v && same_a;
  const std::string fp_v = hex64(fnv1a64(b.video.data(), b.video.size() * 4));
  const std::string fp_a = hex64(fnv1a64(b.audio.data(), b.audio.size() * 4));
  if (r.identical) {
    std::printf("byte-compare stock vs sliced: identical (video %zu B fnv1a64 %s, audio %zu B fnv1a64 %s)\n",
                b.video.size() * 4, fp_v.c_str(), b.audio.size() * 4, fp_a.c_str());
  } else {
    std::printf("byte-compare stock vs sliced: DIFFERENT (video first difference: %s; audio first difference: %s)\n",
                first_difference(a.video, b.video).c_str(), first_difference(a.audio, b.audio).c_str());
  }
  r.comparison = {{"identical", r.identical},
                  {"video_identical", same_v},
                  {"audio_identical", same_a},
                  {"stock_measured_peak_bytes", pa.measured},
                  {"sliced_measured_peak_bytes", pb.measured},
                  {"saved_percent", saved}};
}

// -o's metadata: only what determines the latents' bytes (the weights, the inputs and
// the numerics settings). No plan, budget, residency or timing: files of different
// memory settings are byte-identical (`cmp`); those go to the --json report.
std::map<std::string, std::string> latents_metadata(const GenerateRun& r) {
  const h3::ClipGeometry& g = r.cond.geometry;
  char cfg_text[32];
  std::snprintf(cfg_text, sizeof cfg_text, "%.15g", r.cfg_scale);
  std::map<std::string, std::string> meta{
      {"format", "layerstream-latents"},
      {"producer", "layerstream generate"},
      {"model", r.session->source().describe()},
      {"steps", std::to_string(r.steps)},
      {"cfg", cfg_text},
      {"seed", std::to_string(r.seed)},
      {"sigmas", sample::format_sigmas(r.sched.video)},
      {"frames", std::to_string(g.frames)},
      {"width", std::to_string(g.width)},
      {"height", std::to_string(g.height)},
      {"text_tokens", std::to_string(r.L)},
      {"kv_tile", std::to_string(r.results.back().plan.kv_tile)},
      {"backend", backend_kind(r.session->backend().name())},
      {"numerics", describe(r.session->backend().numerics())},
  };
  if (r.o.text.given()) meta["text"] = r.o.text.text;
  auto joined = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& a : v) s += (s.empty() ? "" : ";") + a;
    return s;
  };
  if (!r.o.keyframes.empty()) meta["keyframes"] = joined(r.o.keyframes);
  if (!r.o.refs.empty()) meta["refs"] = joined(r.o.refs);
  return meta;
}

// ComfyUI's SaveLatent format, which its LoadLatent reads: "latent_tensor" (the latent
// with a batch of one) and an empty "latent_format_version_0" (no legacy 1/0.18215
// scaling). H3's LATENT is a NestedTensor (video, audio) that SaveLatent cannot store,
// so each stream gets its own file, as VAEDecode / VAEDecodeAudio take them.
Status write_comfyui_latent(const std::string& path, const float* data, size_t bytes,
                            const std::vector<int64_t>& shape) {
  SafetensorsWriter w(path, "--comfyui-latents");
  w.set_metadata("format", "layerstream-latents (ComfyUI LoadLatent)");
  w.set_metadata("producer", "layerstream generate");
  LS_TRY(w.declare("latent_tensor", DType::f32, shape));
  LS_TRY(w.declare("latent_format_version_0", DType::f32, {0}));
  LS_TRY(w.begin());
  LS_TRY(w.write_tensor("latent_tensor", data, bytes));
  LS_TRY(w.write_tensor("latent_format_version_0", nullptr, 0));
  return w.commit();
}

nlohmann::json report_json(const GenerateRun& r) {
  const h3::H3Config& cfg = r.cfg();
  const h3::ClipGeometry& g = r.cond.geometry;
  nlohmann::json j;
  j["command"] = "generate";
  j["version"] = version_json();
  j["numerics"] = r.session->backend().numerics();
  j["numerics_from_env"] = r.nc.from_env;
  j["nonfinite_values"] = r.nonfinite;
  j["model"] = r.session->source().describe();
  j["builtin"] = r.builtin;
  j["backend"] = r.session->backend().name();
  j["config"] = {{"hidden", cfg.hidden}, {"num_layers", cfg.num_layers}, {"heads", cfg.heads},
                 {"head_dim", cfg.head_dim}, {"ffn", cfg.ffn}, {"text_dim", cfg.text_dim}};
  j["clip"] = {{"frames", g.frames}, {"width", g.width}, {"height", g.height}, {"T", g.T}, {"Hl", g.Hl},
               {"Wl", g.Wl}, {"A", g.A}, {"text_tokens", r.L}, {"S", r.plans[0].positive.sizes.S},
               {"keyframes", r.cond.keyframes.size()}, {"references", r.cond.refs.size()}};
  j["schedule"] = {{"scheduler", "simple"}, {"sampler", "euler"}, {"steps", r.steps},
                   {"shift_video", r.cond.shift_video}, {"shift_audio", r.cond.shift_audio},
                   {"video_sigmas", r.sched.video}, {"audio_sigmas", r.sched.audio}};
  j["cfg"] = r.cfg_scale;
  j["seed"] = r.seed;
  nlohmann::json rj = nlohmann::json::array();
  for (size_t i = 0; i < r.runs.size(); ++i) rj.push_back(run_json(r.runs[i].label, r.results[i]));
  j["runs"] = rj;
  if (r.builtin) j["comparison"] = r.comparison;
  if (const auto& vp = r.vram_plan()) {
    const VramUse u = vram_use(r.results.back());
    j["vram_budget"] = budget_plan_json(*vp);
    j["vram_budget"]["device_peak_bytes"] = u.peak;
    j["vram_budget"]["weight_copy_bytes"] = u.weight_copies;
  }
  if (r.o.output.given() && r.identical) j["output"] = r.o.output.text;
  return j;
}

// The outputs, staged to temporary files and published together (a signal before or
// during the writes leaves no file of this run; -o and --json are one run's). Returns
// the exit code.
int write_outputs(const GenerateRun& r, const RunInterrupt& interrupt) {
  const GenerateOptions& o = r.o;
  const h3::H3Config& cfg = r.cfg();
  const h3::ClipGeometry& g = r.cond.geometry;
  const sample::GenerateResult& out = r.results.back();
  RunInterrupt::Writing writing;
  io::StagedOutputs staged;
  const auto stage = [&](const std::string& path, const char* what, const auto& write) -> int {
    auto where = staged.add(path, what);
    if (!where.ok()) return fail(where.error());
    if (Status s = write(*where); !s.ok()) return fail(s.error());
    if (!interrupt.pending()) return 0;
    (void)fail(Error{ErrorCode::io, std::string(interrupt.pending() == SIGINT ? "interrupted (SIGINT)" : "terminated") +
                                        " while writing the outputs; nothing was written"});
    return interrupt.exit_code();  // the staged files are removed on the way out
  };
  std::string wrote_line;
  if (o.output.given() && !r.identical)
    std::fprintf(stderr, "%s: not writing %s: the stock and sliced outputs differ\n", kCmd, o.output.text.c_str());
  if (o.output.given() && r.identical) {
    const std::vector<NamedTensor> tensors{
        {"video", TensorView(const_cast<float*>(out.video.data()), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})},
        {"audio", TensorView(const_cast<float*>(out.audio.data()), DType::f32, {cfg.audio_latents_dim, 2, g.A})},
    };
    if (int rc = stage(o.output.text, "-o",
                       [&](const std::string& p) { return write_safetensors(p, tensors, latents_metadata(r)); }))
      return rc;
    char line[512];
    std::snprintf(line, sizeof line, "(video fp32 [%lld, %lld, %lld, %lld], audio fp32 [%lld, 2, %lld])",
                  static_cast<long long>(cfg.latents_dim), static_cast<long long>(g.T), static_cast<long long>(g.Hl),
                  static_cast<long long>(g.Wl), static_cast<long long>(cfg.audio_latents_dim),
                  static_cast<long long>(g.A));
    wrote_line = "wrote " + o.output.text + " " + line;
  }
  if (o.comfy_latents.given() && r.identical) {
    if (int rc = stage(o.comfy_latents.text + ".video.latent", "--comfyui-latents", [&](const std::string& p) {
          return write_comfyui_latent(p, out.video.data(), out.video.size() * sizeof(float),
                                      {1, cfg.latents_dim, g.T, g.Hl, g.Wl});  // 5-D, as ComfyUI holds it
        }))
      return rc;
    if (int rc = stage(o.comfy_latents.text + ".audio.latent", "--comfyui-latents", [&](const std::string& p) {
          return write_comfyui_latent(p, out.audio.data(), out.audio.size() * sizeof(float),
                                      {1, cfg.audio_latents_dim, 2, g.A});
        }))
      return rc;
  }
  if (o.memory_plot.given()) {
    MemoryPlotInput in;
    const auto& vp = r.vram_plan();
    in.title = "generate, " + std::to_string(out.forwards.size()) + " forwards, S " + std::to_string(out.plan.sizes.S) +
               ", " + r.session->backend().name() +
               (vp ? ", --vram-budget " + format_bytes(vp->budget_bytes) : std::string());
    for (const sample::ForwardRecord& f : out.forwards)
      in.samples.insert(in.samples.end(), f.report.memory.begin(), f.report.memory.end());
    in.budget_bytes = vp ? vp->budget_bytes : 0;
    in.predicted_peak_bytes = vp ? vp->predicted_peak_bytes : 0;
    if (int rc = stage(o.memory_plot.text, "--memory-plot",
                       [&](const std::string& p) { return write_memory_plot(p, in); }))
      return rc;
  }
  if (o.json.given())
    if (int rc = stage(o.json.text, "--json", [&](const std::string& p) { return write_json_file(p, report_json(r)); }))
      return rc;
  if (Status s = staged.publish(); !s.ok()) return fail(s.error());
  if (!wrote_line.empty()) std::printf("%s\n", wrote_line.c_str());
  if (interrupt.pending()) {
    std::fprintf(stderr, "%s: interrupted while publishing the outputs: they are complete (all of this run)\n", kCmd);
    return interrupt.exit_code();
  }
  return r.identical ? 0 : 1;
}

int run_generate(const GenerateOptions& o) {
  // ^C / SIGTERM: end at once before the outputs are written, deferred while writing.
  const RunInterrupt interrupt(kCmd);
  GenerateRun r(o);
  // parse + validate: flags, numbers, output paths (usage errors, exit 2, before any file is opened)
  if (Status s = check_flag_combinations(o, &r.memory_request); !s.ok()) return fail(s.error());
  if (Status s = parse_args(r); !s.ok()) return fail(s.error());
  if (o.threads.given()) set_num_threads(static_cast<int>(r.threads));
  if (Status s = check_outputs(o); !s.ok()) return fail(s.error());
  // run: backend + weights, text, conditioning, plans (refusals before any work), the runs
  for (Status (*step)(GenerateRun&) : {open_session, load_text, make_conditioning, plan_runs, run_all})
    if (Status s = step(r); !s.ok()) return fail(s.error());
  if (r.builtin) compare_builtin(r);
  // report: the outputs
  return write_outputs(r, interrupt);
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
  add_plan_flags(sub, *o);
  add_size_flag(sub, "--vram-budget", o->vram_budget, range::budget,
                "ONE device budget for everything (CUDA; weights, AdaLN tables, activations, workspace): the planner "
                "keeps what fits resident, streams the rest of the blocks, offloads K/V and the residual only when "
                "nothing else fits; refused before any work when too small, naming the minimum (--model/--preset)");
  add_device_flags(sub, *o);
  add_report_flags(sub, *o, "write the full run report as JSON (with the version)",
                   "draw the device memory over every forward by phase and block (SVG)");
  add_text_flag(sub, "-o,--output", o->output, "FILE", "output latents (.safetensors); required with --model/--preset");
  add_text_flag(sub, "--comfyui-latents", o->comfy_latents, "PREFIX",
                "also write the latents as ComfyUI .latent files for its LoadLatent node: PREFIX.video.latent "
                "(\"latent_tensor\" [1, 24, T, Hl, Wl]) and PREFIX.audio.latent ([1, 32, 2, A]); decode them with "
                "VAEDecode and VAEDecodeAudio (README, \"From a prompt to an mp4\")");
  sub.add_flag("-q,--quiet", o->quiet, "no progress display");
  return [o]() { return run_generate(*o); };
}

LS_REGISTER_COMMAND(g_generate, "generate",
                    "sample a clip (simple schedule, flow Euler, CFG) and write its latents; with no --model/--preset, "
                    "a built-in demonstration that stock and sliced plans give identical bytes",
                    setup_generate);

}  // namespace
}  // namespace ls::cli
