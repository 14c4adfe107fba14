// `layerstream info ... --vram-budget B | --budget B`: a dry run of the planner
// (cli/info/info.h). No device is opened.
#include <cstdio>
#include <string>

#include <layerstream_version.h>  // LS_BACKENDS

#include "backend/backend.h"  // make_cpu_backend (the CPU's numerics resolution)
#include "core/arena.h"       // format_bytes
#include "exec/budget_plan.h"
#include "exec/plan.h"
#include "exec/planner.h"
#include "model/h3/layout.h"
#include "sample/schedule.h"
#include "cli/info/info.h"
#include "cli/report.h"  // plan_paths

namespace ls::cli::info {

// ---- dry run: what a budget would plan -------------------------------------------------

// The device a dry run plans for: a profile of plain numbers, never an opened device.
// The numerics (cli/cli_util.h numerics_from_flags_and_env) choose the attention
// path, so the default kv_tile and the workspace; the CPU's resolution is its backend's
// own (set_numerics: refusals included), CUDA's the documented one of a build with cuDNN.
Expected<exec::DeviceProfile> dry_run_device(const std::string& device, bool vram, const Numerics& numerics) {
  if (device == "cpu") {
    if (vram)
      return Error{ErrorCode::invalid_argument,
                   "--vram-budget budgets device memory, and the CPU backend has none: its weights are the "
                   "checkpoint's mapped host memory and there is nothing to stream or offload. Give --budget B to "
                   "plan the activation memory (the slices) on the CPU, or --device cuda for a GPU's budget"};
    auto cpu = make_cpu_backend();
    if (Status s = cpu->set_numerics(numerics, {}); !s.ok())
      return Error{ErrorCode::invalid_argument, s.message()};
    exec::DeviceProfile d;
    d.name = "cpu";
    d.default_kv_tile = cpu->default_kv_tile();
    d.assumed = {"kv_tile " + std::to_string(d.default_kv_tile) + ": the CPU backend's default"};
    return d;
  }
  if (device != "cuda" && device.rfind("cuda:", 0) != 0)
    return Error{ErrorCode::invalid_argument, "--device must be cpu, cuda or cuda:N (got '" + device + "')"};
  if (device != "cuda") LS_TRY(parse_int("--device cuda:N", device.substr(5), IntRange{0, 1023}).status());
  // The CUDA backend's description of a build with cuDNN and the Hopper kernel
  // (backend/description.h), resolved as the backend does without a device: attention
  // auto -> cudnn (on an sm_90 GPU a head-dim-128 model runs hopper: --attention hopper
  // plans for that). The profile names the algorithm's default kv_tile (--kv-tile
  // overrides it in the plan).
  const bool native = numerics.attention == AttentionAlgorithm::native;
  const bool hopper = numerics.attention == AttentionAlgorithm::hopper;
  const BackendDescription cuda = cuda_description();
  Numerics asked = numerics;
  asked.kv_tile = 0;
  LS_ASSIGN_OR_RETURN(const Numerics resolved, exec::resolve_described(cuda, asked));
  exec::DeviceProfile d = exec::device_profile(cuda, resolved);
  d.name = device;
  const bool have_cuda = std::string(LS_BACKENDS).find("cuda") != std::string::npos;
  d.assumed.insert(d.assumed.begin(),
                   std::string(have_cuda ? "no device opened" : "this build has no CUDA backend (backends: " LS_BACKENDS ")") +
                       ": the CUDA backend's documented figures in a build with cuDNN" +
                       (native ? " and attention native" : hopper ? " and attention hopper" : "") +
                       " (without cuDNN: 64 MiB workspace, kv_tile 1024" +
                       (native || hopper ? ")" : "; auto runs hopper for head dim 128 on sm_90: --attention hopper plans that)"));
  return d;
}

namespace {

json pcie_json(const exec::BudgetPlan& bp) {
  return {{"weights", bp.pcie_weight_bytes}, {"kv", bp.pcie_kv_bytes}, {"residual", bp.pcie_residual_bytes},
          {"total", bp.pcie_bytes_per_forward()}};
}

json vram_plan_json(const exec::BudgetPlan& bp) {
  const exec::Plan& p = bp.activations;
  return {{"step", bp.step},
          {"num_layers", bp.num_layers},
          {"resident_blocks", bp.resident_blocks},
          {"streamed_blocks", bp.streamed_blocks()},
          {"slots", bp.slots},
          {"prefetch", bp.prefetch},
          {"one_slot_chosen", bp.one_slot_chosen},
          {"kv_offload", bp.kv_offload},
          {"residual_offload", bp.residual_offload},
          {"kv_chunk", bp.kv_chunk},
          {"attn_slice", p.attn_slice},
          {"mlp_slice", p.mlp_slice},
          {"final_slice", p.final_slice},
          {"kv_tile", p.kv_tile},
          {"kv_hiding_slice", bp.kv_hiding_slice},
          {"bytes", {{"block", bp.block_bytes}, {"resident_weights", bp.resident_weight_bytes},
                     {"slots", bp.slot_bytes}, {"modulation_tables", bp.modulation_table_bytes},
                     {"activations", bp.activation_bytes}, {"workspace", bp.workspace_bytes}}},
          {"steps_peak_bytes", bp.steps_peak_bytes},
          {"text_peak_bytes", bp.text_peak_bytes},
          {"precompute_peak_bytes", bp.precompute_peak_bytes},
          {"predicted_peak_bytes", bp.predicted_peak_bytes},
          {"pcie_bytes_per_forward", pcie_json(bp)},
          {"exposed_transfer_seconds", bp.exposed_transfer_seconds},
          {"host_pinned_bytes", bp.host_pinned_bytes},
          {"describe", bp.describe()}};
}

json activation_plan_json(const exec::Plan& p) {
  return {{"paths", plan_paths(p)},
          {"attn_slice", p.attn_slice},
          {"mlp_slice", p.mlp_slice},
          {"final_slice", p.final_slice},
          {"kv_tile", p.kv_tile},
          {"predicted_peak_bytes", p.predicted_peak_bytes},
          {"stock_peak_bytes", p.stock_peak_bytes},
          {"describe", p.describe()}};
}

std::string bytes_and_exact(uint64_t b) { return format_bytes(b) + " (" + std::to_string(b) + " bytes)"; }

}  // namespace

Expected<DryRun> dry_run(const InfoOptions& o, const h3::H3Config& cfg, const std::vector<h3::TensorSpec>& tensors,
                         const h3::ClipGeometry& g, const Numerics& numerics) {
  const bool vram = o.vram_budget.given();
  const FlagText& bflag = vram ? o.vram_budget : o.budget;
  LS_ASSIGN_OR_RETURN(const uint64_t budget, flag_size(bflag, range::budget, 0));
  LS_ASSIGN_OR_RETURN(exec::DeviceProfile dev,
                      dry_run_device(!o.device.empty() ? o.device : (vram ? "cuda" : "cpu"), vram, numerics));
  LS_ASSIGN_OR_RETURN(const int64_t kv_tile, flag_int(o.kv_tile, range::kv_tile, dev.default_kv_tile));
  if (o.kv_tile.given()) {
    // The numerics setting the user chose replaces the assumed default.
    for (auto& a : dev.assumed)
      if (a.rfind("kv_tile ", 0) == 0) a = "kv_tile " + std::to_string(kv_tile) + ": given (--kv-tile)";
  }
  if (!vram) {
    // Activations only: the workspace and the throughput figures play no part.
    std::vector<std::string> keep;
    for (const auto& a : dev.assumed)
      if (a.rfind("workspace ", 0) != 0 && a.rfind("throughput ", 0) != 0) keep.push_back(a);
    dev.assumed = keep;
  }
  h3::Conditioning cond;
  cond.geometry = g;
  DryRun r;
  json jd = {{"budget_flag", bflag.name},
             {"budget_bytes", budget},
             {"device", {{"name", dev.name},
                         {"opened", false},
                         {"workspace_bytes", dev.workspace_bytes},
                         {"default_kv_tile", dev.default_kv_tile},
                         {"pcie_gb_per_s", dev.throughput.pcie_gb_per_s},
                         {"attention_tflops", dev.throughput.attention_tflops},
                         {"assumed", dev.assumed}}},
             {"kv_tile", kv_tile}};
  // The one planner (exec::plan_memory), as forward and generate call it through
  // api::Session: the source's tensor table, the dry run's device profile.
  exec::PlanRequest q;
  q.cfg = &cfg;
  q.tensors = &tensors;
  q.cond = &cond;
  q.mode = vram ? exec::MemoryMode::total_budget : exec::MemoryMode::activation_budget;
  q.knobs.kv_tile = kv_tile;
  q.budget_bytes = budget;
  q.prefetch = !o.no_prefetch;
  q.adaptive_slots = !o.keep_prefetch;
  q.device = dev;
  if (vram) {
    // The AdaLN tables hold one row set per distinct timestep of the run.
    std::string run;
    if (o.steps.given()) {
      LS_ASSIGN_OR_RETURN(const int64_t steps, flag_int(o.steps, range::steps, 4));
      LS_ASSIGN_OR_RETURN(sample::Schedule sched, sample::make_simple_schedule(steps, cond.shift_video, cond.shift_audio));
      q.sigmas = sched.video;
      run = "a generate run of " + std::to_string(steps) + " steps (simple schedule, no CFG)";
      if (cfg.pdd_heads > 1) cond.sample_sigmas = q.sigmas;
    } else {
      LS_ASSIGN_OR_RETURN(const double sigma, flag_float(o.sigma, range::sigma, 1.0));
      q.sigmas = {static_cast<float>(sigma)};
      char b[64];
      std::snprintf(b, sizeof b, "%g", sigma);
      run = std::string("one denoiser call at sigma ") + b + " (as forward)";
      if (cfg.pdd_heads > 1) cond.sample_sigmas = {1.0f, q.sigmas[0], 0.0f};  // forward's one-call stand-in
    }
    LS_ASSIGN_OR_RETURN(const int64_t rows, exec::modulation_rows_for(cfg, cond, q.sigmas));
    jd["run"] = run;
    jd["modulation_rows"] = rows;
  }
  LS_ASSIGN_OR_RETURN(const uint64_t minimum, exec::minimum_budget(q));
  jd["minimum_bytes"] = minimum;
  auto planned = exec::plan_memory(q);
  if (planned.ok()) {
    LS_CHECK(planned->minimum_budget_bytes == minimum);
    jd["plan"] = vram ? vram_plan_json(*planned->budget) : activation_plan_json(planned->plan);
    jd["refused"] = nullptr;
  } else if (planned.error().code == ErrorCode::out_of_budget) {
    jd["plan"] = nullptr;
    jd["refused"] = planned.error().message;
    r.refused = planned.error();
  } else {
    return planned.error();
  }
  r.j = std::move(jd);
  return r;
}

void print_dry_run(const json& d) {
  const bool vram = d["budget_flag"] == "--vram-budget";
  const auto B = [](const json& v) { return format_bytes(v.get<uint64_t>()); };
  const std::string dev = d["device"]["name"].get<std::string>();
  std::printf("\ndry run     %s %s%s on %s%s\n", d["budget_flag"].get<std::string>().c_str(),
              bytes_and_exact(d["budget_bytes"].get<uint64_t>()).c_str(), vram ? "" : ", activations only", dev.c_str(),
              dev == "cpu" ? "" : " (no device opened)");
  for (const auto& a : d["device"]["assumed"]) std::printf("assumed     %s\n", a.get<std::string>().c_str());
  if (vram)
    std::printf("run         %s: AdaLN tables for %lld distinct timestep%s\n", d["run"].get<std::string>().c_str(),
                static_cast<long long>(d["modulation_rows"].get<int64_t>()),
                d["modulation_rows"].get<int64_t>() == 1 ? "" : "s");
  const json& p = d["plan"];
  if (p.is_null()) {
    std::printf("plan        refused: %s is below the minimum (a run would stop before any work)\n",
                B(d["budget_bytes"]).c_str());
  } else if (vram) {
    const int64_t L = p["num_layers"].get<int64_t>(), R = p["resident_blocks"].get<int64_t>();
    std::printf("plan        %s\n", p["step"].get<std::string>().c_str());
    if (R == L)
      std::printf("residency   all %lld blocks resident, no slots\n", static_cast<long long>(L));
    else
      std::printf("residency   %lld/%lld blocks resident, %lld streamed through %lld slot%s of %s (%s)\n",
                  static_cast<long long>(R), static_cast<long long>(L), static_cast<long long>(L - R),
                  static_cast<long long>(p["slots"].get<int64_t>()), p["slots"].get<int64_t>() == 1 ? "" : "s",
                  B(p["bytes"]["block"]).c_str(),
                  p["prefetch"].get<bool>()          ? "prefetch"
                  : p["one_slot_chosen"].get<bool>() ? "no prefetch: the planner gave the second slot's bytes to larger "
                                                       "slices, which expose less transfer; --keep-prefetch keeps two"
                                                     : "no prefetch");
    std::printf("offloads    K/V %s; residual %s\n",
                p["kv_offload"].get<bool>()
                    ? ("offloaded (chunks of " + std::to_string(p["kv_chunk"].get<int64_t>()) + " keys)").c_str()
                    : "on device",
                p["residual_offload"].get<bool>() ? "offloaded (two slices per phase, copies overlapped)" : "on device");
    const int64_t a = p["attn_slice"].get<int64_t>();
    std::printf("slices      attention %s, MLP %lld rows, head %lld rows; kv_tile %lld\n",
                a == 0 ? "stock (all rows)" : (std::to_string(a) + " rows (two-pass)").c_str(),
                static_cast<long long>(p["mlp_slice"].get<int64_t>()), static_cast<long long>(p["final_slice"].get<int64_t>()),
                static_cast<long long>(p["kv_tile"].get<int64_t>()));
    const json& b = p["bytes"];
    std::printf("peak        %s predicted = weights %s + slots %s + AdaLN tables %s + activations %s + workspace %s\n",
                bytes_and_exact(p["predicted_peak_bytes"].get<uint64_t>()).c_str(), B(b["resident_weights"]).c_str(),
                B(b["slots"]).c_str(), B(b["modulation_tables"]).c_str(), B(b["activations"]).c_str(),
                B(b["workspace"]).c_str());
    std::printf("            (the largest of: steps %s, text refinement %s, AdaLN precompute %s)\n",
                B(p["steps_peak_bytes"]).c_str(), B(p["text_peak_bytes"]).c_str(), B(p["precompute_peak_bytes"]).c_str());
    const json& x = p["pcie_bytes_per_forward"];
    std::printf("PCIe        %s per forward: weights %s, K/V %s, residual %s", B(x["total"]).c_str(),
                B(x["weights"]).c_str(), B(x["kv"]).c_str(), B(x["residual"]).c_str());
    if (p["kv_offload"].get<bool>() || p["residual_offload"].get<bool>())
      std::printf("; about %.1f s per forward not hidden by compute (by the throughput figures)",
                  p["exposed_transfer_seconds"].get<double>());
    std::printf("\n");
    if (p["host_pinned_bytes"].get<uint64_t>() > 0)
      std::printf("host        %s pinned (K/V and/or residual offload)\n", B(p["host_pinned_bytes"]).c_str());
  } else {
    std::printf("plan        %s\n", p["paths"].get<std::string>().c_str());
    const int64_t a = p["attn_slice"].get<int64_t>();
    std::printf("slices      attention %s, MLP %lld rows, head %lld rows; kv_tile %lld\n",
                a == 0 ? "stock (all rows)" : (std::to_string(a) + " rows (two-pass)").c_str(),
                static_cast<long long>(p["mlp_slice"].get<int64_t>()), static_cast<long long>(p["final_slice"].get<int64_t>()),
                static_cast<long long>(p["kv_tile"].get<int64_t>()));
    std::printf("peak        %s of activations predicted (stock plan %s)\n",
                bytes_and_exact(p["predicted_peak_bytes"].get<uint64_t>()).c_str(), B(p["stock_peak_bytes"]).c_str());
  }
  std::printf("minimum     %s: the smallest %s that plans this clip\n",
              bytes_and_exact(d["minimum_bytes"].get<uint64_t>()).c_str(), d["budget_flag"].get<std::string>().c_str());
}

// ---- info --devices: what this machine and build can run on ----------------------------

}  // namespace ls::cli::info
