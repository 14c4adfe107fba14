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
#include <optional>
#include <string>
#include <vector>

#include "api/session.h"
#include "core/arena.h"  // format_bytes
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "model/h3/torch_random.h"
#include "cli/command.h"
#include "cli/cli_util.h"
#include "cli/inputs.h"
#include "cli/interrupt.h"
#include "io/output_file.h"
#include "cli/memory_plot.h"
#include "cli/progress.h"
#include "cli/report.h"

namespace ls::cli {
namespace {

constexpr const char* kCmd = "layerstream forward";

struct ForwardOptions : RunFlags {
  FlagText blocks, sigma;
  FlagText mask, inputs;
  bool random_weights = false;
  FlagText resident_blocks, slots, kv_chunk;
  bool no_prefetch = false, keep_prefetch = false, kv_offload = false, residual_offload = false;
};

// A --keyframe FILE[@FRAME|@last] (cli_util.h's one grammar): the file through the shared
// loader (cli/inputs.h), the frame from @FRAME, @last, the file's "pixel_frame" metadata, or 0.
Expected<h3::Keyframe> load_keyframe(const std::string& arg, const h3::H3Config& cfg, const h3::ClipGeometry& g) {
  LS_ASSIGN_OR_RETURN(const KeyframeArg ka, parse_keyframe_arg(arg));
  LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(ka.path));
  std::optional<std::string> meta_frame;
  LS_ASSIGN_OR_RETURN(h3::Keyframe k, load_forward_keyframe(*file, cfg, g, meta_frame));
  LS_ASSIGN_OR_RETURN(k.pixel_frame, keyframe_pixel_frame(ka, meta_frame, g.frames));
  return k;
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

// ---- parse -> validate -> run -> report (issue 27 item 4) -----------------------------
// Each step returns an Error whose code decides the exit (invalid_argument and
// out_of_budget: 2, the rest 1; cli/cli_util.h exit_code_for).

Error usage_error(const std::string& msg) { return {ErrorCode::invalid_argument, msg}; }

// Flag combinations: every refusal a usage error, before any number is read.
Status check_flag_combinations(const ForwardOptions& o, api::MemoryRequest* memory_request) {
  if (o.model.given() == o.preset.given())
    return usage_error("give exactly one of --model FILE or --preset NAME (synthetic weights)");
  if (o.random_weights && !o.preset.given())
    return usage_error("--random-weights needs --preset tiny|small|h3 (the shapes to make)");
  if (o.weights_seed.given() && o.model.given())
    return usage_error("--weights-seed has no effect with --model (a file has its own weights): it goes with --preset");
  if (o.blocks.given() && o.model.given()) return usage_error("--blocks goes with --preset (a file has its own blocks)");
  // The memory flags: one request, the library's one validation (api::resolve_memory,
  // the same rules and messages at every door).
  const MemoryFlags memory_flags{&o.vram_budget, &o.budget,    &o.mlp_chunk,      &o.attn_chunk,
                                 &o.final_chunk, &o.kv_chunk,  &o.resident_blocks, &o.slots,
                                 o.kv_offload,   o.residual_offload, o.no_prefetch, o.keep_prefetch};
  if (auto m = memory_from_flags(memory_flags, memory_request); !m.ok()) return m.error();
  if (o.devices.given() && o.device.given())
    return usage_error("--device and --devices are exclusive: --devices lists every rank's device");
  return Status();
}

// The flags' numbers (the one strict parser, cli/cli_util.h).
struct ForwardArgs {
  int64_t frames = 0, width = 0, height = 0, text_tokens = 0, seed = 0, weights_seed = 0, threads = 0, blocks = 0;
  int64_t kv_tile = 0, resident_blocks = -1;
  float sigma = 0;
  uint64_t budget = 0, vram_budget = 0;
  exec::PlanKnobs knobs;
  exec::Residency residency;
};

Expected<ForwardArgs> parse_args(const ForwardOptions& o) {
  ForwardArgs a;
  LS_ASSIGN_OR_RETURN(a.frames, flag_int(o.frames, range::frames, 0));
  LS_ASSIGN_OR_RETURN(a.width, flag_int(o.width, range::width, 0));
  LS_ASSIGN_OR_RETURN(a.height, flag_int(o.height, range::height, 0));
  LS_ASSIGN_OR_RETURN(a.text_tokens, flag_int(o.text_tokens, range::text_tokens, 0));
  LS_ASSIGN_OR_RETURN(a.seed, flag_int(o.seed, range::seed, 0));
  LS_ASSIGN_OR_RETURN(a.weights_seed, flag_int(o.weights_seed, range::seed, 0));
  LS_ASSIGN_OR_RETURN(a.threads, flag_int(o.threads, range::threads, 0));
  LS_TRY(slice_knobs_from_flags(o, a.knobs, a.kv_tile));
  LS_ASSIGN_OR_RETURN(a.knobs.kv_chunk_rows, flag_int(o.kv_chunk, range::kv_chunk, 0));
  LS_ASSIGN_OR_RETURN(a.resident_blocks, flag_int(o.resident_blocks, range::resident_blocks, -1));
  LS_ASSIGN_OR_RETURN(a.residency.slots, flag_int(o.slots, range::slots, 2));
  LS_ASSIGN_OR_RETURN(a.blocks, flag_int(o.blocks, range::blocks, 0));
  LS_ASSIGN_OR_RETURN(a.sigma, flag_float32(o.sigma, range::sigma, 0.0f));
  LS_ASSIGN_OR_RETURN(a.budget, flag_size(o.budget, range::budget, 0));
  LS_ASSIGN_OR_RETURN(a.vram_budget, flag_size(o.vram_budget, range::budget, 0));
  a.knobs.kv_offload = o.kv_offload;
  a.knobs.residual_offload = o.residual_offload;
  a.residency.resident_blocks = a.resident_blocks;
  return a;
}

// Every output path, and that none is another output or one of the input files.
Status check_outputs(const ForwardOptions& o) {
  std::vector<std::pair<std::string, std::string>> outputs;
  std::vector<std::pair<std::string, std::string>> inputs;  // an output naming one would replace it
  run_file_paths(o, outputs, inputs);
  if (o.inputs.given()) inputs.emplace_back("--inputs", o.inputs.text);
  if (o.mask.given()) inputs.emplace_back("--mask", o.mask.text);
  return check_output_paths(outputs, inputs);
}

// The backend(s) first: what a flag means can depend on it (the chain: api::Session).
// Numerics (every bit-changing setting): flags, then developer variables, resolved by
// the backend; printed, and stored in the report and the output file.
Expected<std::unique_ptr<api::Session>> open_session(const ForwardOptions& o, const ForwardArgs& a,
                                                     const api::MemoryRequest& memory_request, NumericsChoice& nc) {
  LS_ASSIGN_OR_RETURN(nc, numerics_from_flags_and_env(kCmd, o.numerics, o.kv_tile.given() ? a.kv_tile : 0));
  LS_ASSIGN_OR_RETURN(const std::vector<std::string> devices, rank_devices(o));
  LS_ASSIGN_OR_RETURN(auto session, api::Session::open_backends(devices, nc.numerics, nc.diagnostics));
  LS_TRY(api::check_memory_device(memory_request, session->device_is_cpu(), api::kFlagNames));
  api::WeightsSpec weights;
  if (o.model.given()) {
    weights.model_path = o.model.text;
  } else {
    weights.preset = o.preset.text;
    weights.weights_seed = static_cast<uint64_t>(a.weights_seed);
    if (o.blocks.given()) weights.blocks = a.blocks;
  }
  if (Status ws = apply_weight_flags(o.lora, o.wflags, o.model.given(), weights); !ws.ok())
    return usage_error(ws.message());
  LS_TRY(session->load_weights(weights));
  // After the weights: attention auto resolves per model (Session::load_weights), so this
  // line names the algorithm that runs.
  std::printf("[LayerStream] numerics: %s\n", describe(session->backend().numerics()).c_str());
  if (!weights.loras.empty() || weights.precision != "preserve" || session->config().quant.any())
    std::printf("[LayerStream] weights: %s\n", session->source().describe().c_str());  // LoRAs, formats, "lossy"
  const int64_t layers = session->config().num_layers;
  if (o.slots.given() && a.resident_blocks >= layers)
    return usage_error("--slots has no effect: --resident-blocks " + std::to_string(a.resident_blocks) +
                       " keeps all " + std::to_string(layers) + " blocks resident, so nothing streams");
  return session;
}

// The run's conditioning and inputs: everything that can be refused is refused here,
// before any work (shapes of --inputs, --keyframe and --mask files included).
struct ForwardInputsAndCond {
  h3::Conditioning cond;
  std::vector<float> video, audio, text;
};
Expected<ForwardInputsAndCond> load_conditioning(const ForwardOptions& o, const ForwardArgs& a,
                                                 const h3::H3Config& cfg) {
  ForwardInputsAndCond in;
  LS_ASSIGN_OR_RETURN(const h3::ClipGeometry g, h3::clip_geometry(a.frames, a.width, a.height, a.text_tokens));
  in.cond.geometry = g;
  in.cond.seed = static_cast<uint64_t>(a.seed);
  for (const auto& k : o.keyframes) {
    LS_ASSIGN_OR_RETURN(h3::Keyframe kf, load_keyframe(k, cfg, g));
    in.cond.keyframes.push_back(std::move(kf));
  }
  if (o.mask.given()) {
    LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(o.mask.text));
    LS_TRY(load_mask(*file, g, in.cond));
  }
  if (cfg.pdd_heads > 1) in.cond.sample_sigmas = {1.0f, a.sigma, 0.0f};  // one-call stand-in schedule
  if (o.inputs.given()) {  // caller-given inputs, shapes checked now
    LS_ASSIGN_OR_RETURN(auto file, SafetensorsReader::open(o.inputs.text));
    LS_ASSIGN_OR_RETURN(ForwardInputs f, load_forward_inputs(*file, cfg, g));
    in.video = std::move(f.video), in.audio = std::move(f.audio), in.text = std::move(f.text);
  } else {  // seeded inputs: PyTorch's CPU randn (video seed, audio seed + 1, text seed + 2)
    in.video = h3::torch_cpu_randn(in.cond.seed, cfg.latents_dim * g.T * g.Hl * g.Wl);
    in.audio = h3::torch_cpu_randn(in.cond.seed + 1, cfg.audio_latents_dim * 2 * g.A);
    in.text = h3::torch_cpu_randn(in.cond.seed + 2, g.text_tokens * cfg.text_dim);
  }
  return in;
}

api::MemorySpec memory_spec(const ForwardOptions& o, const ForwardArgs& a) {
  api::MemorySpec memory;
  memory.mode = o.vram_budget.given() ? api::MemoryMode::total_budget
                : o.budget.given()    ? api::MemoryMode::activation_budget
                                      : api::MemoryMode::knobs;
  memory.knobs = a.knobs;
  memory.residency = a.residency;
  memory.activation_budget = a.budget;
  memory.total_budget = a.vram_budget;
  memory.prefetch = !o.no_prefetch;
  memory.adaptive_slots = !o.keep_prefetch;
  return memory;
}

// The denoiser call (engine, progress, the call) and the non-finite check of its output:
// an error (nothing written) unless --allow-nonfinite. `nonfinite` gets the count.
Expected<exec::ForwardResult> run_call(const ForwardOptions& o, api::Session& session, const api::RunPlan& run_plan,
                                       const ForwardInputsAndCond& in, const exec::CallLayout& layout, float sigma,
                                       int64_t& nonfinite) {
  const h3::H3Config& cfg = session.config();
  const h3::ClipGeometry& g = in.cond.geometry;
  std::unique_ptr<Progress> bar;
  exec::EngineOptions eo;
  eo.check_finite = !o.allow_nonfinite;
  eo.record_memory = o.memory_plot.given();
  eo.progress = [&bar](int64_t done, int64_t) {
    if (bar) bar->set_done(done);
  };
  LS_TRY(session.create_engine(run_plan, eo));
  api::DenoiseCall call;
  call.cond = &in.cond;
  call.text = TensorView(const_cast<float*>(in.text.data()), DType::f32, {g.text_tokens, cfg.text_dim});
  call.video = TensorView(const_cast<float*>(in.video.data()), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl});
  call.audio = TensorView(const_cast<float*>(in.audio.data()), DType::f32, {cfg.audio_latents_dim, 2, g.A});
  call.sigma = sigma;
  call.plan = &run_plan.plan;
  call.layout = &layout;
  bool forward_begun = false;
  call.before_forward = [&]() {
    forward_begun = true;
    if (!o.quiet) bar = std::make_unique<Progress>("forward", "blocks", cfg.num_layers);
  };
  auto r = session.denoise(call);
  if (!r.ok()) {
    if (bar) bar->abandon();
    return forward_begun ? nothing_written(r.error()) : r.error();
  }
  if (bar) bar->finish();
  LS_ASSIGN_OR_RETURN(nonfinite, check_outputs_finite(kCmd, r->video, r->audio, "output", o.allow_nonfinite));
  return r;
}

// Only what determines the tensors' bytes: the weights, the inputs and the numerics
// settings. No plan, budget, residency or timing: files of different memory settings
// are byte-identical (`cmp`); those go to the --json report.
std::map<std::string, std::string> output_metadata(const ForwardOptions& o, const api::Session& session,
                                                   const h3::Conditioning& cond, const exec::Plan& plan, float sigma,
                                                   int64_t seed) {
  const h3::ClipGeometry& g = cond.geometry;
  char sigma_text[32];
  std::snprintf(sigma_text, sizeof sigma_text, "%.9g", static_cast<double>(sigma));
  std::map<std::string, std::string> meta = {{"format", "layerstream-forward"},
                                             {"sigma", sigma_text},
                                             {"seed", std::to_string(seed)},
                                             {"frames", std::to_string(g.frames)},
                                             {"width", std::to_string(g.width)},
                                             {"height", std::to_string(g.height)},
                                             {"text_tokens", std::to_string(g.text_tokens)},
                                             {"kv_tile", std::to_string(plan.kv_tile)},
                                             {"backend", backend_kind(session.backend().name())},
                                             {"numerics", describe(session.backend().numerics())},
                                             {"weights", session.source().describe()}};
  if (!o.keyframes.empty()) {
    std::string k;
    for (const auto& a : o.keyframes) k += (k.empty() ? "" : ";") + a;
    meta["keyframes"] = k;
  }
  if (o.mask.given()) meta["mask"] = o.mask.text;
  if (o.inputs.given()) meta["inputs"] = o.inputs.text;
  return meta;
}

// What the report needs besides the session.
struct ForwardOutcome {
  const ForwardArgs* args = nullptr;
  const NumericsChoice* numerics = nullptr;
  const ForwardInputsAndCond* in = nullptr;
  const api::RunPlan* run_plan = nullptr;
  const exec::ForwardResult* result = nullptr;
  int64_t nonfinite = 0;
  nlohmann::json vram_budget_json;  // null unless --vram-budget
};

// The outputs, staged to temporary files and published together (a signal before or
// during the writes leaves no file of this run; -o and --json are one run's), then the
// status lines. Returns the exit code.
int report(const ForwardOptions& o, const api::Session& session, const ForwardOutcome& out,
           const RunInterrupt& interrupt) {
  const h3::H3Config& cfg = session.config();
  const h3::ClipGeometry& g = out.in->cond.geometry;
  const exec::ForwardResult& r = *out.result;
  const exec::Plan& plan = out.run_plan->plan;
  const std::string hash_hex = hex64(r.hash());
  const uint64_t budget_line = out.run_plan->budget ? out.args->vram_budget : 0;  // the memory plot's line
  // cudaMemGetInfo's view: what the device lost between before create() and the
  // fullest moment sampled (after create, refinement, precompute and the forward),
  // including the CUDA context's lazily created pieces and allocator rounding.
  const uint64_t driver_used = session.driver_used_bytes();
  {
    RunInterrupt::Writing writing;
    io::StagedOutputs staged;
    const auto interrupted = [&]() {
      (void)fail({ErrorCode::io, std::string(interrupt.pending() == SIGINT ? "interrupted (SIGINT)" : "terminated") +
                                     " while writing the outputs; nothing was written"});
      return interrupt.exit_code();  // the staged files are removed on the way out
    };
    const auto stage = [&](const FlagText& f, const char* what, const auto& write) -> int {
      auto where = staged.add(f.text, what);
      if (!where.ok()) return fail(where.error());
      if (Status w = write(*where); !w.ok()) return fail(w.error());
      return interrupt.pending() ? interrupted() : 0;
    };
    if (o.output.given())
      if (int rc = stage(o.output, "-o", [&](const std::string& path) {
            return write_safetensors(
                path,
                {{"video", TensorView(const_cast<float*>(r.video.data()), DType::f32, {cfg.latents_dim, g.T, g.Hl, g.Wl})},
                 {"audio", TensorView(const_cast<float*>(r.audio.data()), DType::f32, {cfg.audio_latents_dim, 2, g.A})}},
                output_metadata(o, session, out.in->cond, plan, out.args->sigma, out.args->seed));
          }))
        return rc;
    if (o.memory_plot.given())
      if (int rc = stage(o.memory_plot, "--memory-plot", [&](const std::string& path) {
            MemoryPlotInput in;
            in.title = "forward, S " + std::to_string(plan.sizes.S) + ", " + session.backend().name() +
                       (budget_line ? ", --vram-budget " + format_bytes(budget_line) : std::string());
            in.samples = r.report.memory;
            in.budget_bytes = budget_line;
            in.predicted_peak_bytes =
                out.vram_budget_json.is_null() ? 0 : out.vram_budget_json["predicted_peak_bytes"].get<uint64_t>();
            return write_memory_plot(path, in);
          }))
        return rc;
    if (o.json.given())
      if (int rc = stage(o.json, "--json", [&](const std::string& path) {
            nlohmann::json j = nlohmann::json::parse(r.report.to_json());
            j["command"] = "forward";
            j["version"] = version_json();
            j["numerics"] = session.backend().numerics();
            j["numerics_from_env"] = out.numerics->from_env;
            j["output_hash"] = hash_hex;
            j["nonfinite_values"] = out.nonfinite;
            j["driver_used_bytes"] = driver_used;
            j["plan"] = plan_json(plan);
            j["vram_budget"] = out.vram_budget_json;
            j["memory_plan"] = memory_plan_json(*out.run_plan);
            j["weights"] = session.source().describe();
            if (o.output.given()) j["output"] = o.output.text;
            return write_json_file(path, j);
          }))
        return rc;
    if (Status p = staged.publish(); !p.ok()) return fail(p.error());
  }
  std::printf("%s\n", r.report.status_line().c_str());
  if (session.has_driver_memory_info())
    std::printf("[LayerStream] device memory (driver): %s used by this run at most; LayerStream's arenas peaked at %s\n",
                format_bytes(driver_used).c_str(), format_bytes(r.report.device_peak_bytes).c_str());
  std::printf("[LayerStream] output hash %s (FNV-1a 64 of the velocities)\n", hash_hex.c_str());
  if (interrupt.pending()) {
    std::fprintf(stderr, "%s: interrupted while publishing the outputs: they are complete (all of this run)\n", kCmd);
    return interrupt.exit_code();
  }
  return 0;
}

int run_forward(const ForwardOptions& o) {
  // ^C / SIGTERM: end at once before the outputs are written, deferred while writing.
  const RunInterrupt interrupt(kCmd);
  // parse + validate: flags, numbers, output paths (usage errors, exit 2, before any file is opened)
  api::MemoryRequest memory_request;
  if (Status s = check_flag_combinations(o, &memory_request); !s.ok()) return fail(s.error());
  auto args = parse_args(o);
  if (!args.ok()) return fail(args.error());
  if (Status s = check_outputs(o); !s.ok()) return fail(s.error());
  set_num_threads(static_cast<int>(args->threads));
  // run: backend, weights, conditioning, plan (refusals before any work), the call
  NumericsChoice nc;
  auto session = open_session(o, *args, memory_request, nc);
  if (!session.ok()) return fail(session.error());
  auto in = load_conditioning(o, *args, (*session)->config());
  if (!in.ok()) return fail(in.error());
  // The call's packed layout: built once, handed to the planner and the engine's steps.
  const exec::CallLayout layout((*session)->config(), in->cond, /*for_forward=*/true);
  auto run_plan = (*session)->plan(in->cond, {args->sigma}, memory_spec(o, *args), nullptr, &layout);
  if (!run_plan.ok()) return fail(run_plan.error());
  ForwardOutcome out;
  if (run_plan->budget) {
    std::printf("[LayerStream] %s\n", run_plan->budget->describe().c_str());
    out.vram_budget_json = budget_plan_json(*run_plan->budget);
    std::fflush(stdout);
  }
  auto r = run_call(o, **session, *run_plan, *in, layout, args->sigma, out.nonfinite);
  if (!r.ok()) return fail(r.error());
  // report: the outputs and the status lines
  out.args = &*args;
  out.numerics = &nc;
  out.in = &*in;
  out.run_plan = &*run_plan;
  out.result = &*r;
  return report(o, **session, out, interrupt);
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
  add_plan_flags(sub, *o);
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
               "with --kv-offload: keys per streamed K/V chunk, a multiple of --kv-tile (with --attention int8 also of 128; 0 = about 4096, int8 16384)", "0");
  sub.add_flag("--residual-offload", o->residual_offload,
               "manual: the residual stream in pinned host memory (needs --attn-chunk)");
  add_report_flags(sub, *o, "write the run report (plan, peaks, PCIe bytes, time, output hash, version)",
                   "draw the device memory over the run by phase and block (SVG)");
  add_device_flags(sub, *o);
  sub.add_flag("-q,--quiet", o->quiet, "no progress display");
  add_text_flag(sub, "-o,--output", o->output, "FILE",
                "output velocities (.safetensors); optional, the hash is always printed");
  return [o]() { return run_forward(*o); };
}

LS_REGISTER_COMMAND(forward_cmd, "forward", "one H3 denoiser call on seeded inputs; writes both velocities", setup);

}  // namespace
}  // namespace ls::cli
