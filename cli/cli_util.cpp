#include "cli_util.h"  // (not "cli/...": tests/test_cli_parse.cpp compiles this file in)

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "api/memory_request.h"
#include "api/session.h"
#include "core/printable.h"
#include "io/output_file.h"

namespace ls::cli {
namespace {

// The long name of "-o,--output" ("--output"), else the first name.
std::string flag_name(const std::string& names) {
  std::string first, pick;
  size_t b = 0;
  while (b <= names.size()) {
    size_t e = names.find(',', b);
    if (e == std::string::npos) e = names.size();
    std::string n = names.substr(b, e - b);
    if (first.empty()) first = n;
    if (pick.empty() && n.rfind("--", 0) == 0) pick = n;
    b = e + 1;
  }
  return pick.empty() ? first : pick;
}

std::string opts_text(const std::string& type, const std::string& def, bool required) {
  std::string s = type;
  if (!def.empty()) s += " [" + def + "]";
  if (required) s += " REQUIRED";
  return s;
}

}  // namespace

Expected<int64_t> parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  return parse_int(std::string_view(flag), std::string_view(text), IntRange{lo, hi});
}

Expected<KeyframeArg> parse_keyframe_arg(const std::string& arg) {
  KeyframeArg k;
  k.path = arg;
  const size_t at = arg.rfind('@');
  if (at == std::string::npos || at + 1 >= arg.size()) return k;
  const std::string f = arg.substr(at + 1);
  if (f == "last") {
    k.last = true;
  } else if (std::all_of(f.begin(), f.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    LS_ASSIGN_OR_RETURN(const int64_t fr, parse_int("--keyframe frame", f, 0, 10000000));
    k.frame = fr;
  } else {
    return k;  // not a frame: '@' is part of the path
  }
  k.path = arg.substr(0, at);
  return k;
}

Expected<int64_t> keyframe_pixel_frame(const KeyframeArg& k, const std::optional<std::string>& meta, int64_t frames) {
  int64_t f = 0;
  if (k.last) {
    f = frames - 1;
  } else if (k.frame) {
    f = *k.frame;
  } else if (meta) {
    LS_ASSIGN_OR_RETURN(f, parse_int(k.path + " metadata pixel_frame", *meta, 0, 10000000));
  }
  if (f >= frames)
    return Error{ErrorCode::invalid_argument, k.path + ": keyframe at pixel frame " + std::to_string(f) +
                                                  " is past the clip's last frame " + std::to_string(frames - 1)};
  return f;
}

Expected<api::MemorySpec> memory_from_flags(const MemoryFlags& f, api::MemoryRequest* request) {
  if (f.keep_prefetch && f.no_prefetch)
    return Error{ErrorCode::invalid_argument, "give --no-prefetch (one slot) or --keep-prefetch (two), not both"};
  api::MemoryRequest r;
  const auto given = [](const FlagText* t) { return t != nullptr && t->given(); };
  // Each given flag's text through the library's grammar and range (ranges.h).
  const auto size = [&](const FlagText* t, std::optional<uint64_t>& out) -> Status {
    if (!given(t)) return {};
    LS_ASSIGN_OR_RETURN(out, parse_size(t->name, t->text, range::budget));
    return {};
  };
  const auto integer = [&](const FlagText* t, const IntRange& rg, std::optional<int64_t>& out) -> Status {
    if (!given(t)) return {};
    LS_ASSIGN_OR_RETURN(out, parse_int(std::string_view(t->name), std::string_view(t->text), rg));
    return {};
  };
  // Which flags are given decides the combination messages, whatever their values: a
  // given flag with a bad value is refused for its value only once the combination is fine.
  const auto mark = [&](const FlagText* t, std::optional<int64_t>& out) {
    if (given(t)) out = 0;
  };
  mark(f.mlp_chunk, r.mlp_chunk), mark(f.attn_chunk, r.attn_chunk), mark(f.final_chunk, r.final_chunk);
  mark(f.kv_chunk, r.kv_chunk), mark(f.resident_blocks, r.resident_blocks), mark(f.slots, r.slots);
  if (given(f.vram_budget)) r.vram_budget = 1;
  if (given(f.budget)) r.activation_budget = 1;
  if (f.kv_offload) r.kv_offload = true;
  if (f.residual_offload) r.residual_offload = true;
  if (f.no_prefetch) r.prefetch = 0;
  if (f.keep_prefetch) r.prefetch = 2;
  r.mode = api::infer_mode(r);
  if (r.slots) r.slots = 1;
  if (r.resident_blocks) r.resident_blocks = 0;
  LS_TRY(api::resolve_memory(r, api::kFlagNames));  // the combinations
  LS_TRY(integer(f.mlp_chunk, range::chunk, r.mlp_chunk));
  LS_TRY(integer(f.attn_chunk, range::chunk, r.attn_chunk));
  LS_TRY(integer(f.final_chunk, range::chunk, r.final_chunk));
  LS_TRY(integer(f.kv_chunk, range::kv_chunk, r.kv_chunk));
  LS_TRY(integer(f.resident_blocks, range::resident_blocks, r.resident_blocks));
  LS_TRY(integer(f.slots, range::slots, r.slots));
  LS_TRY(size(f.budget, r.activation_budget));
  LS_TRY(size(f.vram_budget, r.vram_budget));
  LS_ASSIGN_OR_RETURN(api::MemorySpec spec, api::resolve_memory(r, api::kFlagNames));
  if (request) *request = r;
  return spec;
}

namespace {
// One option read as text into f: its --help type name, the "TYPE ... [default]" text shown
// (opts_text) and whether it is required.
CLI::Option* add_flag_as(CLI::App& app, const std::string& names, FlagText& f, const std::string& type,
                         const std::string& shown, const std::string& desc, const std::string& def, bool required) {
  f.name = flag_name(names);
  f.opt = app.add_option(names, f.text, desc);
  f.opt->type_name(type)->option_text(opts_text(shown, def, required));
  if (required) f.opt->required();
  return f.opt;
}
}  // namespace

CLI::Option* add_text_flag(CLI::App& app, const std::string& names, FlagText& f, const std::string& type,
                           const std::string& desc, const std::string& def, bool required) {
  return add_flag_as(app, names, f, type, type, desc, def, required);
}

CLI::Option* add_int_flag(CLI::App& app, const std::string& names, FlagText& f, const IntRange& r,
                          const std::string& desc, const std::string& def, bool required) {
  return add_flag_as(app, names, f, "INT", "INT " + describe(r), desc, def, required);
}

CLI::Option* add_float_flag(CLI::App& app, const std::string& names, FlagText& f, const FloatRange& r,
                            const std::string& desc, const std::string& def, bool required) {
  return add_flag_as(app, names, f, "FLOAT", "FLOAT in " + describe(r), desc, def, required);
}

CLI::Option* add_size_flag(CLI::App& app, const std::string& names, FlagText& f, const SizeRange& r,
                           const std::string& desc, const std::string& def) {
  return add_flag_as(app, names, f, "SIZE", "SIZE",
                     desc + " (bytes or K/M/G/T = KiB/MiB/GiB/TiB, 1024-based; " + describe(r) + ")", def, false);
}

Expected<int64_t> flag_int(const FlagText& f, const IntRange& r, int64_t def) {
  if (!f.given()) return def;
  return parse_int(std::string_view(f.name), std::string_view(f.text), r);
}

Expected<double> flag_float(const FlagText& f, const FloatRange& r, double def) {
  if (!f.given()) return def;
  return parse_float(f.name, f.text, r);
}

Expected<uint64_t> flag_size(const FlagText& f, const SizeRange& r, uint64_t def) {
  if (!f.given()) return def;
  return parse_size(f.name, f.text, r);
}

Expected<float> flag_float32(const FlagText& f, const FloatRange& r, float def) {
  if (!f.given()) return def;
  return parse_float32(f.name, f.text, r);
}

Status check_output_paths(const std::vector<std::pair<std::string, std::string>>& flag_and_path,
                          const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::vector<io::NamedPath> outs, ins;
  for (const auto& [flag, path] : flag_and_path) outs.push_back({flag, path});
  for (const auto& [flag, path] : inputs) ins.push_back({flag, path});
  return io::check_outputs_against_inputs(outs, ins);
}

int exit_code_for(const Error& e) {
  return e.code == ErrorCode::invalid_argument || e.code == ErrorCode::out_of_budget ? kExitUsage : kExitRuntime;
}

int report_error(std::string_view command, const Error& e) {
  // The CLI's error sink: file bytes quoted in the message are escaped here, in one place.
  std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(command.size()), command.data(),
               printable_text(e.message).c_str());
  return exit_code_for(e);
}

// ---- numerics ----------------------------------------------------------------------

void add_numerics_flags(CLI::App& app, NumericsFlags& f) {
  add_text_flag(app, "--attention", f.attention, "auto|native|cudnn|hopper|int8",
                "attention algorithm (numerics: changes output bits): auto = the backend's default for the model "
                "(CUDA: hopper for head dim 128 on an sm_90 GPU, else cudnn where built, else native; CPU: "
                "native, the reference); hopper = the sm_90a kernel (CUDA on Hopper, head dim 128); int8 = INT8 Q/K/V and P "
                "(docs/int8-attention.md; CPU, CUDA sm_80+ at head dim 128); the run's "
                "numerics line names the one that ran",
                "auto");
  add_text_flag(app, "--gemm-f32", f.gemm_f32, "lanes16|cublaslt",
                "fp32 GEMM order (numerics: changes output bits): lanes16 = the CPU reference's order (CUDA gives "
                "the CPU's bytes); cublaslt = the pinned cuBLASLt path (CUDA only)",
                "lanes16");
}

Expected<NumericsChoice> numerics_from_flags_and_env(std::string_view command, const NumericsFlags& f, int64_t kv_tile,
                                                     bool quiet) {
  NumericsChoice c;
  c.numerics.kv_tile = kv_tile;
  const auto note = [&](const std::string& line) {
    if (!quiet) std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(command.size()), command.data(), line.c_str());
  };
  // The flags first; a developer variable for what no flag gave (the mapping: numerics.h,
  // apply_developer_variables, the one place that knows the variables).
  std::vector<std::string> skip;
  const auto flag = [&](const FlagText& fl, const char* var, auto parse, auto& field) -> Status {
    if (!fl.given()) return Status();
    auto p = parse(fl.text);
    if (!p.ok()) return Error{ErrorCode::invalid_argument, fl.name + ": " + p.error().message};
    field = *p;
    skip.push_back(var);
    if (const char* v = std::getenv(var); v != nullptr && v[0] != '\0')
      note(std::string("developer variable ") + var + "=" + v + " ignored: " + fl.name + " " + fl.text + " given");
    return Status();
  };
  LS_TRY(flag(f.attention, "LAYERSTREAM_ATTENTION", parse_attention, c.numerics.attention));
  LS_TRY(flag(f.gemm_f32, "LAYERSTREAM_GEMM_F32", parse_gemm_f32, c.numerics.gemm_f32));
  LS_TRY(apply_developer_variables([](const char* name) -> const char* { return std::getenv(name); }, &c.numerics,
                                   &c.diagnostics, &c.from_env, skip));
  for (const std::string& e : c.from_env) note("using developer variable " + e);
  // Field ranges and names (the backend then says what it cannot honour).
  if (Status s = validate(c.numerics); !s.ok()) {
    std::string where = c.from_env.empty() ? std::string() : " (from the environment:";
    for (const std::string& e : c.from_env) where += " " + e;
    if (!c.from_env.empty()) where += ")";
    return Error{ErrorCode::invalid_argument, s.message() + where};
  }
  return c;
}

void add_lora_flags(CLI::App& app, LoraFlags& f) {
  app.add_option("--lora", f.loras,
                 "A LoRA to merge into the weights (ComfyUI's key formats and formula), optionally with a strength: "
                 "FILE or FILE:STRENGTH; repeatable, applied in the order given")
      ->type_name("FILE[:STRENGTH]");
  add_text_flag(app, "--lora-dtype", f.dtype, "auto|f32|f16|bf16",
                "Compute dtype of the LoRA merge (numerics: changes bits): auto = ComfyUI's for the device (f16 on "
                "CUDA, f32 on the CPU); bf16 = ComfyUI's cast-time merge (dynamic VRAM / lowvram, docs/lora.md)",
                "auto");
}

void add_plan_flags(CLI::App& app, RunFlags& o) {
  add_int_flag(app, "--mlp-chunk", o.mlp_chunk, range::chunk, "rows per MLP / patch-embedding slice (0 = all)", "0");
  add_int_flag(app, "--attn-chunk", o.attn_chunk, range::chunk,
               "rows per attention slice, two-pass (0 = stock attention)", "0");
  add_int_flag(app, "--final-chunk", o.final_chunk, range::chunk, "rows per final-layer slice (0 = all)", "0");
  add_int_flag(app, "--kv-tile", o.kv_tile, range::kv_tile,
               "keys per attention tile: a numerics setting (1024 on the CPU and with --attention native; 8192 on "
               "CUDA with hopper or cudnn attention, which auto picks; 128 with --attention int8, where it must "
               "divide 4096, the int8 statistics block, and CUDA runs 128 only)", "the device's");
  add_numerics_flags(app, o.numerics);
  add_lora_flags(app, o.lora);
  add_weight_flags(app, o.wflags);
  add_size_flag(app, "--budget", o.budget, range::budget,
                "activation memory budget: the largest slices that fit (not with the chunk flags)");
}

void add_report_flags(CLI::App& app, RunFlags& o, const std::string& json_help, const std::string& plot_help) {
  app.add_flag("--allow-nonfinite", o.allow_nonfinite,
               "write the output even when it holds NaN or inf (a warning gives the count); without it such a run "
               "fails (exit 1) naming the first block and phase, and writes nothing");
  add_text_flag(app, "--json", o.json, "FILE", json_help);
  add_text_flag(app, "--memory-plot", o.memory_plot, "FILE.svg", plot_help);
}

void add_device_flags(CLI::App& app, RunFlags& o) {
  add_text_flag(app, "--device", o.device, "DEVICE", "cpu | cuda | cuda:N", "cpu");
  add_text_flag(app, "--devices", o.devices, "LIST",
                "sequence parallel over several devices (one rank each, output bytes equal one device's): "
                "cuda:0,cuda:1,... or cpu*N (N in-process CPU ranks); the count must divide the model's heads; "
                "budgets are per device");
  add_int_flag(app, "--threads", o.threads, range::threads, "CPU threads (0 = all cores)", "0");
}

void add_weight_flags(CLI::App& app, WeightFlags& f) {
  add_text_flag(app, "--format", f.format, "FORMAT",
                "With --preset: the synthetic weights in ComfyUI's layouts: bf16, int8-convrot (the pruned int8 "
                "ConvRot files), int8-convrot-full (+ the AdaLN linears at group 64), int8-convrot-skip-edges "
                "(int8-convrot with blocks 0, 1, L-2, L-1 in bf16) or fp8 (fp8_scaled e4m3); a "
                "--model file has its own",
                "bf16");
  add_text_flag(app, "--precision", f.precision, "MODE",
                "preserve = the weights as stored; fp8 = convert the bf16 qkv, fc1 and fc2 weights to fp8 e4m3 once at "
                "load (per-tensor amax/448, LOSSY, changes the output); fp8-dynamic = the same with a per-row "
                "activation scale (lossy, not ComfyUI's numerics)",
                "preserve");
}

Status apply_weight_flags(const LoraFlags& lf, const WeightFlags& wf, bool model_file, api::WeightsSpec& spec) {
  for (const std::string& a : lf.loras) {
    LS_ASSIGN_OR_RETURN(lora::LoraFile f, lora::parse_lora_arg(a));
    spec.loras.push_back(std::move(f));
  }
  if (lf.dtype.given() && lf.dtype.text != "auto") {
    lora::MergeDtype dt{};
    if (!lora::parse_merge_dtype(lf.dtype.text, &dt))
      return make_error(ErrorCode::invalid_argument,
                        "--lora-dtype must be auto, f32, f16 or bf16, got \"" + lf.dtype.text + "\"");
    spec.lora_dtype = dt;
    if (spec.loras.empty()) return make_error(ErrorCode::invalid_argument, "--lora-dtype has no effect without --lora");
  }
  if (wf.format.given()) {
    if (model_file)
      return make_error(ErrorCode::invalid_argument,
                        "--format goes with --preset (synthetic weights); a --model file has its own format (its "
                        ".comfy_quant tensors say it)");
    spec.weights_format = wf.format.text;
  }
  if (wf.precision.given()) {
    if (wf.precision.text != "preserve" && wf.precision.text != "fp8" && wf.precision.text != "fp8-dynamic")
      return make_error(ErrorCode::invalid_argument,
                        "--precision must be preserve, fp8 or fp8-dynamic, got \"" + wf.precision.text + "\"");
    spec.precision = wf.precision.text;
  }
  return Status();
}

Status slice_knobs_from_flags(const RunFlags& o, exec::PlanKnobs& knobs, int64_t& kv_tile) {
  LS_ASSIGN_OR_RETURN(knobs.mlp_chunk_tokens, flag_int(o.mlp_chunk, range::chunk, 0));
  LS_ASSIGN_OR_RETURN(knobs.attn_chunk_tokens, flag_int(o.attn_chunk, range::chunk, 0));
  LS_ASSIGN_OR_RETURN(knobs.final_chunk_tokens, flag_int(o.final_chunk, range::chunk, 0));
  LS_ASSIGN_OR_RETURN(kv_tile, flag_int(o.kv_tile, range::kv_tile, 1));
  knobs.kv_tile = o.kv_tile.given() ? kv_tile : 0;  // 0: the device's (Session::resolve_kv_tile)
  return Status();
}

void run_file_paths(const RunFlags& o, std::vector<std::pair<std::string, std::string>>& outputs,
                    std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const FlagText* f : {&o.output, &o.json, &o.memory_plot})
    if (f->given()) outputs.emplace_back(f->name == "--output" ? "-o" : f->name, f->text);
  if (o.model.given()) inputs.emplace_back("--model", o.model.text);
  for (const std::string& l : o.lora.loras) inputs.emplace_back("--lora", l);
  for (const std::string& k : o.keyframes) inputs.emplace_back("--keyframe", k);
}

Expected<std::vector<std::string>> rank_devices(const RunFlags& o) {
  if (o.devices.given()) return parse_devices("--devices", o.devices.text);
  return std::vector<std::string>{o.device.given() ? o.device.text : "cpu"};
}

Expected<std::vector<std::string>> parse_devices(std::string_view flag, std::string_view text) {
  auto d = api::parse_devices(std::string(text));
  if (!d.ok()) return Error{ErrorCode::invalid_argument, std::string(flag) + " " + d.error().message};
  return d;
}

}  // namespace ls::cli
