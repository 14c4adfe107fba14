// `layerstream info`: what a checkpoint (or a preset) is, and with a clip, how many
// tokens it makes, how much activation memory a block needs, and (a dry run) what a
// budget would plan; or whether a file holds non-finite values.
//
//   layerstream info FILE                     detected config, parameters and bytes by group
//   layerstream info --preset h3 [--adaln-curve] [--blocks N]
//   ... --frames F --width W --height H [--text-tokens L]   clip geometry, S, the
//        h3-model.md §6.4 buffer table and the activation arena of the stock and the
//        sliced plan (--slice-tokens), from the one planner (exec::plan_memory: the
//        buffer lists forward allocates)
//   ... --vram-budget B [--device cuda] [--kv-tile N] [--attention A] [--no-prefetch | --keep-prefetch] [--sigma S | --steps N]
//        a dry run of the planner's total-budget mode (docs/budget.md): residency, offloads,
//        slices, predicted peak, PCIe bytes, and the smallest budget that plans. No device
//        is opened: the CUDA backend's figures are its description's
//        (backend/description.h, exec::device_profile) for the numerics asked (--attention / --gemm-f32 or
//        the developer variables, cli/cli_util.h), printed as assumed.
//   ... --budget B [--device cpu|cuda] [--kv-tile N]   the planner's activation-budget mode
//   ... --json                                the same as one JSON object on stdout
//   layerstream info --check FILE [--json]    every tensor of a safetensors file scanned
//        for NaN / +inf / -inf (one pass through the mapping); exit 1 when any is found
//
// Exit codes (cli/cli_util.h): 0 ok; 2 a usage error (flags, a budget below the
// minimum); 1 a file that cannot be read or is not what it should be, or --check found
// non-finite values.
#include <memory>
#include <string>

#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/info/info.h"

namespace ls::cli::info {
namespace {

bool model_or_plan_flags(const InfoOptions& o) {
  return !o.preset.empty() || o.blocks.given() || o.adaln_curve || o.frames.given() || o.width.given() ||
         o.height.given() || o.text_tokens.given() || o.slice_tokens.given() || o.list_tensors ||
         o.vram_budget.given() || o.budget.given() || o.kv_tile.given() || o.sigma.given() || o.steps.given() ||
         o.device_opt->count() > 0 || o.no_prefetch || o.keep_prefetch;
}

// The flags first (every refusal a usage error, exit 2, before any file is opened), then
// the subcommand: --devices, --check, or the description of a file / preset (+ clip, dry run).
int run_info(const InfoOptions& o) {
  const bool clip_asked = o.frames.given() || o.width.given() || o.height.given();
  const bool planning = o.vram_budget.given() || o.budget.given();
  if (o.devices) {
    const bool others = !o.file.empty() || model_or_plan_flags(o) || o.check;
    if (others) return usage_error("--devices lists the devices and takes no other flag but --json, --attention and --gemm-f32");
    return run_devices(o);
  }
  if (o.check) {
    // Only the file and --json mean anything to the scan.
    const bool others = model_or_plan_flags(o) || o.numerics.attention.given() || o.numerics.gemm_f32.given();
    if (o.file.empty()) return usage_error("--check needs a FILE (any safetensors file: a checkpoint, an output)");
    if (others) return usage_error("--check scans FILE for non-finite values and takes no other flag but --json");
    return run_check(o);
  }
  if (o.file.empty() == o.preset.empty()) return usage_error("give a checkpoint FILE or --preset NAME (one of them)");
  if (clip_asked && (!o.frames.given() || !o.width.given() || !o.height.given()))
    return usage_error("a clip needs all of --frames, --width and --height");
  if (!clip_asked && (o.text_tokens.given() || o.slice_tokens.given() || planning))
    return usage_error(std::string(planning ? (o.vram_budget.given() ? "--vram-budget" : "--budget")
                                            : (o.text_tokens.given() ? "--text-tokens" : "--slice-tokens")) +
                       " needs a clip: --frames F --width W --height H");
  if (o.vram_budget.given() && o.budget.given())
    return usage_error("give --vram-budget (the total device budget) or --budget (activations only), not both");
  if (!planning && (o.device_opt->count() > 0 || o.kv_tile.given()))
    return usage_error(std::string(o.kv_tile.given() ? "--kv-tile" : "--device") +
                       " has no effect without --vram-budget B or --budget B (a dry run)");
  if (o.no_prefetch && o.keep_prefetch) return usage_error("give --no-prefetch (one slot) or --keep-prefetch (two), not both");
  if (!o.vram_budget.given() && (o.no_prefetch || o.keep_prefetch || o.sigma.given() || o.steps.given()))
    return usage_error(std::string(o.no_prefetch     ? "--no-prefetch"
                                   : o.keep_prefetch ? "--keep-prefetch"
                                   : o.sigma.given() ? "--sigma"
                                                     : "--steps") +
                       " goes with --vram-budget (the AdaLN tables and block slots are part of the total budget)");
  if (o.sigma.given() && o.steps.given())
    return usage_error("give --sigma (one denoiser call, as forward) or --steps (a generate run), not both");
  if (planning && !o.text_tokens.given())
    return usage_error("a dry run needs --text-tokens L, as forward and generate do (S counts the text rows)");
  if (!planning && (o.numerics.attention.given() || o.numerics.gemm_f32.given()))
    return usage_error(std::string(o.numerics.attention.given() ? "--attention" : "--gemm-f32") +
                       " has no effect without --vram-budget B or --budget B (a dry run)");
  Numerics numerics;
  if (planning) {
    auto chosen = numerics_from_flags_and_env(kCmd, o.numerics);
    if (!chosen.ok()) return fail(chosen.error());
    numerics = chosen->numerics;
    auto d = dry_run_device(!o.device.empty() ? o.device : (o.vram_budget.given() ? "cuda" : "cpu"),
                            o.vram_budget.given(), numerics);
    if (!d.ok()) return fail(d.error());
  }
  return run_describe(o, numerics);
}

CommandRun setup_info(CLI::App& sub) {
  auto o = std::make_shared<InfoOptions>();
  sub.add_option("file", o->file, "H3 checkpoint (.safetensors); with --check any safetensors file");
  sub.add_option("--preset", o->preset, "Describe a preset (tiny, small, h3) instead of a file");
  add_int_flag(sub, "--blocks", o->blocks, range::blocks, "With --preset: number of DiT blocks", "the preset's");
  sub.add_flag("--adaln-curve", o->adaln_curve, "With --preset: the curve (pruned) form");
  add_int_flag(sub, "--frames", o->frames, range::frames, "Clip: pixel frames (snapped up to 17j+5)");
  add_int_flag(sub, "--width", o->width, range::width, "Clip: width in pixels (multiple of 32)");
  add_int_flag(sub, "--height", o->height, range::height, "Clip: height in pixels (multiple of 32)");
  add_int_flag(sub, "--text-tokens", o->text_tokens, range::text_tokens,
               "Clip: text tokens L (required by a dry run; describing only: none)");
  add_int_flag(sub, "--slice-tokens", o->slice_tokens, range::slice_tokens, "Slice size of the sliced memory table",
               "8192");
  sub.add_flag("--tensors", o->list_tensors, "List every tensor (name, group, dtype, shape, bytes)");
  sub.add_flag("--json", o->as_json, "Print one JSON object instead of text");
  add_size_flag(sub, "--vram-budget", o->vram_budget, range::budget,
                "Dry run (needs a clip): the plan a TOTAL device budget gives (residency, offloads, slices, "
                "predicted peak, PCIe bytes) and the smallest budget that plans; no device is opened");
  add_size_flag(sub, "--budget", o->budget, range::budget,
                "Dry run (needs a clip): the slices an ACTIVATION budget gives and the smallest that plans");
  o->device_opt = sub.add_option("--device", o->device,
                                 "Dry run: the device planned for, cpu | cuda[:N] (default: cuda with --vram-budget, cpu "
                                 "with --budget); CUDA figures are the backend's documented defaults, and with no "
                                 "device opened attention auto is planned as cudnn (an sm_90 GPU runs hopper for "
                                 "H3: --attention hopper plans that)");
  add_int_flag(sub, "--kv-tile", o->kv_tile, range::kv_tile, "Dry run: keys per attention tile (numerics)",
               "the device's: 1024 on the CPU and with --attention native, 8192 on CUDA with hopper or cudnn");
  sub.add_flag("--no-prefetch", o->no_prefetch, "With --vram-budget: one block slot instead of two");
  sub.add_flag("--keep-prefetch", o->keep_prefetch,
               "With --vram-budget: two block slots even when offloading, where the planner would give the second "
               "slot's bytes to larger slices (one slot) because that exposes less transfer");
  add_numerics_flags(sub, o->numerics);
  add_float_flag(sub, "--sigma", o->sigma, range::sigma,
                 "With --vram-budget: plan one denoiser call at this sigma (as forward)", "1");
  add_int_flag(sub, "--steps", o->steps, range::steps,
               "With --vram-budget: plan a generate run of N steps (the AdaLN tables of its whole schedule)");
  sub.add_flag("--check", o->check,
               "Scan every tensor of FILE for NaN / +inf / -inf; exit 1 when any is found");
  sub.add_flag("--devices", o->devices,
               "List the devices this build runs on (the CPU and every CUDA GPU: name, memory, and the numerics "
               "attention auto resolves to for H3's head dim 128 and for others); opens each GPU");
  return [o]() { return run_info(*o); };
}

LS_REGISTER_COMMAND(register_info, "info", "Describe an H3 checkpoint or preset, and a clip's tokens and memory", setup_info);

}  // namespace
}  // namespace ls::cli::info
