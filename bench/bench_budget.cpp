// Issue 5's benchmark: the whole H3 model (synthetic weights made once in host memory,
// the values make-model would write) at one clip size, ONE denoiser call per total
// device budget, through the same path as `layerstream forward --vram-budget`: the
// api::Session chain (src/api/session.h: exec::plan_memory's total-budget mode with the
// backend's device profile -> Engine with resident blocks + slots -> refine_text ->
// precompute_adaln -> prepare -> forward).
//
// Per budget: the planner's choice and predicted peak; the forward's wall time (its
// own clock, the call ends with a device synchronize) and its ratio to the unlimited run
// (when "unlimited" comes first), the seconds it added against the planner's predicted
// exposed transfer time (BudgetPlan::exposed_transfer_seconds); LayerStream's device peak (every
// arena, counted) and the driver's view (cudaMemGetInfo: the most free memory the
// device lost since before the engine existed, sampled after each phase); PCIe bytes
// (streamed weights, K/V, residual, each, and the plan's prediction); the output's FNV-1a 64 hash and whether it equals
// the reference (the first budget of the list, or --reference-hash from another run).
// Budgets below the minimum are recorded as refused, with the planner's message.
//
// Before the first budget a one-block model runs once at the same clip, so every GEMM
// has its cuBLASLt algorithm pinned and the cuDNN attention plans for the clip's tile
// lengths exist before anything is timed (both are made once per process; a block has
// the same shapes whatever the block count). Plans for other K/V strides (sliced and
// offloaded attention) are built at their first use, a fraction of a second.
//
// Usage:
//   bench_budget [--preset h3] [--blocks N] [--frames 362 --width 1024 --height 1024
//                --text-tokens 500] [--sigma 0.9] [--kv-tile N] [--budgets unlimited,24G,12G,8G,6G,4G,3G]
//                (a budget SIZE:keep-prefetch: two block slots where the planner would take one;
//                SIZE:no-prefetch: one slot)
//                [--reference-hash HEX] [--device cuda] [--json out.json]
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "api/session.h"
#include "bench_args.h"
#include "bench_clip.h"
#include "bench_json.h"
#include "core/arena.h"  // format_bytes
#include "model/h3/torch_random.h"

namespace {

using namespace ls;
using bench::Clip;

[[noreturn]] void die(const std::string& m) { bench::die("bench_budget", 2, m); }

struct Args : bench::ModelClipArgs {
  std::string device = "cuda", json, reference_hash, attention = "auto";
  bool profile = false;
  int64_t kv_tile = 0;  // 0: the backend's default_kv_tile()
  std::vector<std::string> budgets = {"unlimited", "24G", "12G", "8G", "6G", "4G", "3G"};
};

Args parse(int argc, char** argv) {
  Args a;
  bench::Flags f("bench_budget",
                 std::string("bench_budget: the whole model, one denoiser call per total device budget (issue 5)\n") +
                     bench::kModelClipUsage +
                     "  --kv-tile N         keys per attention tile (default: the device's; 8192 with CUDA + cuDNN)\n"
                     "  --budgets LIST      comma list: unlimited, 24G, 3.5GiB, ... (default "
                     "unlimited,24G,12G,8G,6G,4G,3G);\n"
                     "                      SIZE:keep-prefetch keeps two block slots where the planner would take one,\n"
                     "                      SIZE:no-prefetch uses one whatever the budget\n"
                     "  --reference-hash H  compare outputs to this hash (else to the first budget's output)\n"
                     "  --device D          cuda | cuda:N | cpu (default cuda)\n"
                     "  --attention A       auto | native | cudnn | hopper | int8 (default auto; a numerics setting:\n"
                     "                      int8 changes the output bits, recorded in the JSON)\n"
                     "  --json FILE         write the results\n"
                     "  --profile 1         synchronise at phase boundaries and report seconds per phase (diagnostic)\n",
                 2);
  bench::add_model_clip(f, a)
      .integer("--kv-tile", a.kv_tile)
      .list("--budgets", a.budgets)
      .text("--reference-hash", a.reference_hash)
      .text("--device", a.device)
      .text("--attention", a.attention)
      .text("--json", a.json)
      .with("--profile", [&](const std::string& v) { a.profile = v == "1"; })
      .parse(argc, argv);
  return a;
}

struct Outcome {
  exec::ForwardResult r;
  uint64_t driver_used = 0;
  double engine_seconds = 0, precompute_seconds = 0;
};

// One engine of the session: create, refine, precompute, prepare, forward (the
// session samples the driver's free memory around each).
Expected<Outcome> run_once(api::Session& session, const Clip& clip, float sigma, const api::RunPlan& rp,
                           bool profile = false) {
  const h3::H3Config& cfg = session.config();
  Outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  exec::EngineOptions eo;
  eo.residency.release_source = false;  // the next budget reuses the host weights
  eo.profile = profile;
  LS_TRY(session.create_engine(rp, eo));
  const auto t1 = std::chrono::steady_clock::now();
  api::DenoiseCall call;
  bench::set_inputs(call, clip, cfg);
  call.sigma = sigma;
  call.plan = &rp.plan;
  api::DenoiseTimes times;
  LS_ASSIGN_OR_RETURN(o.r, session.denoise(call, &times));  // arenas and pinned buffers outside the timed call
  session.drop_engine();
  o.driver_used = session.driver_used_bytes();
  o.engine_seconds = std::chrono::duration<double>(t1 - t0).count();
  o.precompute_seconds = times.refine_precompute_prepare_seconds;  // refine, precompute, prepare
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  Numerics numerics;
  {
    auto attention = parse_attention(a.attention);
    if (!attention.ok()) die(attention.error().message);
    numerics.attention = *attention;
  }
  auto opened = api::Session::open_backend(a.device, numerics);
  if (!opened.ok()) die(opened.error().message);
  api::Session& session = **opened;
  api::WeightsSpec weights;
  weights.preset = a.preset;
  weights.blocks = a.blocks;
  if (Status st = session.load_weights(weights); !st.ok()) die(st.error().message);
  const h3::H3Config* cfg = &session.config();
  const int64_t kv_tile = session.resolve_kv_tile(a.kv_tile);
  const Clip clip = bench::make_clip("bench_budget", *cfg, a.frames, a.width, a.height, a.text_tokens);
  auto sizes = exec::sequence_sizes(*cfg, clip.cond);
  if (!sizes.ok()) die(sizes.error().message);
  std::printf("bench_budget: %s, %" PRId64 " blocks, S = %" PRId64 " (%" PRId64 " frames %" PRId64 "x%" PRId64
              ", %" PRId64 " text tokens), sigma %.3f, on %s\n",
              a.preset.c_str(), cfg->num_layers, sizes->S, a.frames, a.width, a.height, a.text_tokens, a.sigma,
              session.backend().name().c_str());
  std::fflush(stdout);

  // Pin every GEMM algorithm and build every cuDNN attention plan (one per key-tile
  // length, so the clip's own S) before timing: one block, the real clip, on the same
  // backend (a second session sharing it).
  {
    auto warm = api::Session::with_backend(session.shared_backend());
    api::WeightsSpec one = weights;
    one.blocks = 1;
    if (Status st = warm->load_weights(one); !st.ok()) die(st.error().message);
    const Clip warm_clip = bench::make_clip("bench_budget", warm->config(), a.frames, a.width, a.height, a.text_tokens);
    api::MemorySpec m;
    m.knobs.kv_tile = kv_tile;
    auto rp = warm->plan(warm_clip.cond, {a.sigma}, m);
    if (!rp.ok()) die(rp.error().message);
    auto w = run_once(*warm, warm_clip, a.sigma, *rp);
    if (!w.ok()) die("warm-up: " + w.error().message);
  }

  api::MemorySpec memory;
  memory.mode = api::MemoryMode::total_budget;
  memory.knobs.kv_tile = kv_tile;
  auto minimum = session.minimum_budget(clip.cond, {a.sigma}, memory);
  if (!minimum.ok()) die(minimum.error().message);
  std::printf("smallest total budget that plans: %s (%" PRIu64 " bytes)\n", format_bytes(*minimum).c_str(), *minimum);

  std::string reference = a.reference_hash;
  double unlimited_seconds = 0;
  std::ostringstream js;
  js << "{\"bench\": \"bench_budget\", \"preset\": \"" << a.preset << "\", \"blocks\": " << cfg->num_layers
     << ", \"S\": " << sizes->S << ", \"frames\": " << a.frames << ", \"width\": " << a.width << ", \"height\": " << a.height
     << ", \"text_tokens\": " << a.text_tokens << ", \"sigma\": " << a.sigma << ", \"device\": \"" << bench::json_escape(session.backend().name())
     << "\", \"attention\": \"" << a.attention << "\", \"kv_tile\": " << kv_tile << ", \"min_total_budget_bytes\": " << *minimum << ", \"runs\": [";
  std::vector<std::string> table;
  // The JSON is rewritten after every budget, so a run cut short keeps what it measured.
  auto write_json = [&](bool complete) {
    if (a.json.empty()) return;
    std::ostringstream doc;
    doc << js.str() << "], \"complete\": " << (complete ? "true" : "false") << ", \"reference_hash\": \"" << reference
        << "\", \"unlimited_forward_seconds\": " << unlimited_seconds << "}\n";
    if (!bench::write_json_text(a.json, doc.str())) die("cannot write " + a.json);
  };
  for (size_t bi = 0; bi < a.budgets.size(); ++bi) {
    if (bi > 0) write_json(false);
    const std::string& b = a.budgets[bi];
    // "3G:keep-prefetch": two block slots even where the planner would take one
    // (BudgetOptions::adaptive_slots off); "4G:no-prefetch": one slot whatever the
    // budget; for side-by-side comparisons.
    const size_t colon = b.find(':');
    const std::string size = b.substr(0, colon), suffix = colon == std::string::npos ? "" : b.substr(colon + 1);
    if (!suffix.empty() && suffix != "keep-prefetch" && suffix != "no-prefetch")
      die("unknown budget suffix ':" + suffix + "' (:keep-prefetch or :no-prefetch)");
    memory.adaptive_slots = suffix != "keep-prefetch";
    memory.prefetch = suffix != "no-prefetch";
    const uint64_t bytes = size == "unlimited" ? (1ull << 50) : [&] {
      auto v = exec::parse_byte_size(size);
      if (!v.ok()) die(v.error().message);
      return *v;
    }();
    js << (bi ? ", " : "") << "{\"budget\": \"" << b << "\", \"budget_bytes\": " << (size == "unlimited" ? 0 : bytes);
    memory.total_budget = bytes;
    auto rp = session.plan(clip.cond, {a.sigma}, memory);
    if (!rp.ok()) {
      std::printf("[%s] refused: %s\n", b.c_str(), rp.error().message.c_str());
      js << ", \"refused\": \"" << bench::json_escape(rp.error().message) << "\"}";
      table.push_back(b + " | refused before any work |");
      continue;
    }
    const exec::BudgetPlan* bp = &*rp->budget;
    std::printf("[%s] %s\n", b.c_str(), bp->describe().c_str());
    std::fflush(stdout);
    auto o = run_once(session, clip, a.sigma, *rp, a.profile);
    if (!o.ok()) {
      std::printf("[%s] FAILED: %s\n", b.c_str(), o.error().message.c_str());
      js << ", \"failed\": \"" << bench::json_escape(o.error().message) << "\"}";
      table.push_back(b + " | FAILED |");
      continue;
    }
    const exec::RunReport& r = o->r.report;
    const std::string h = bench::hex16(o->r.hash());
    if (reference.empty()) reference = h;
    if (b == "unlimited") unlimited_seconds = r.wall_seconds;
    const bool same = h == reference;
    const uint64_t pcie = r.pcie_weight_bytes + r.pcie_kv_bytes + r.pcie_residual_bytes;
    // Against the unlimited run (when it ran first): the ratio and the seconds this plan
    // added, next to what the planner predicted its offload copies would not hide.
    const double ratio = unlimited_seconds > 0 ? r.wall_seconds / unlimited_seconds : 0.0;
    const double extra = unlimited_seconds > 0 ? r.wall_seconds - unlimited_seconds : 0.0;
    std::printf("[%s] %s\n[%s] forward %.3f s (x%.3f unlimited); LayerStream device peak %s (predicted %s); driver %s; "
                "PCIe %.2f GB (weights %.2f, K/V %.2f, residual %.2f; predicted %.2f); exposed transfer predicted "
                "%.3f s, measured extra %.3f s; hash %s %s\n",
                b.c_str(), r.status_line().c_str(), b.c_str(), r.wall_seconds, ratio,
                format_bytes(r.device_peak_bytes).c_str(), format_bytes(bp->predicted_peak_bytes).c_str(),
                format_bytes(o->driver_used).c_str(), pcie / 1e9, r.pcie_weight_bytes / 1e9, r.pcie_kv_bytes / 1e9,
                r.pcie_residual_bytes / 1e9, bp->pcie_bytes_per_forward() / 1e9, bp->exposed_transfer_seconds, extra,
                h.c_str(), same ? "(identical)" : "(DIFFERS)");
    for (const auto& [phase, sec] : r.phase_seconds) std::printf("[%s]   %-18s %8.3f s\n", b.c_str(), phase.c_str(), sec);
    std::fflush(stdout);
    js << ", \"step\": \"" << bench::json_escape(bp->step) << "\", \"plan\": \"" << bench::json_escape(bp->describe())
       << "\", \"predicted_peak_bytes\": " << bp->predicted_peak_bytes
       << ", \"predicted_host_pinned_bytes\": " << rp->peak.host_pinned_bytes << ", \"predicted_pcie_bytes\": "
       << bp->pcie_bytes_per_forward() << ", \"predicted_exposed_transfer_seconds\": " << bp->exposed_transfer_seconds
       << ", \"attn_slice\": " << bp->activations.attn_slice << ", \"mlp_slice\": " << bp->activations.mlp_slice
       << ", \"kv_chunk\": " << bp->kv_chunk << ", \"forward_seconds\": " << r.wall_seconds
       << ", \"x_unlimited\": " << ratio << ", \"extra_seconds_vs_unlimited\": " << extra
       << ", \"engine_create_seconds\": " << o->engine_seconds << ", \"refine_precompute_prepare_seconds\": " << o->precompute_seconds
       << ", \"device_peak_bytes\": " << r.device_peak_bytes << ", \"driver_used_bytes\": " << o->driver_used
       << ", \"pcie_bytes\": " << pcie << ", \"pcie_weight_bytes\": " << r.pcie_weight_bytes
       << ", \"pcie_kv_bytes\": " << r.pcie_kv_bytes << ", \"pcie_residual_bytes\": " << r.pcie_residual_bytes
       << ", \"output_hash\": \"" << h << "\", \"identical_to_reference\": "
       << (same ? "true" : "false") << ", \"report\": " << r.to_json() << "}";
    char line[512];
    std::snprintf(line, sizeof line, "%s | %s | %lld / %lld | %.2f s | %s | %.3f s | %.3f s | %s | %s | %.1f GB | %s %s", b.c_str(),
                  bp->step.c_str(), static_cast<long long>(bp->activations.attn_slice),
                  static_cast<long long>(bp->activations.mlp_slice), r.wall_seconds,
                  ratio > 0 ? (std::to_string(ratio).substr(0, 5)).c_str() : "-", bp->exposed_transfer_seconds, extra,
                  format_bytes(r.device_peak_bytes).c_str(), format_bytes(o->driver_used).c_str(), pcie / 1e9, h.c_str(),
                  same ? "identical" : "DIFFERS");
    table.push_back(line);
  }
  write_json(true);
  std::printf("\nbudget | step | attn / MLP slice | forward | x unlimited | exposed predicted | extra measured | "
              "LayerStream peak | driver | PCIe | hash\n");
  for (const auto& l : table) std::printf("%s\n", l.c_str());
  return 0;
}
