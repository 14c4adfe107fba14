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
//        the developer variables, tools/cli_util.h), printed as assumed.
//   ... --budget B [--device cpu|cuda] [--kv-tile N]   the planner's activation-budget mode
//   ... --json                                the same as one JSON object on stdout
//   layerstream info --check FILE [--json]    every tensor of a safetensors file scanned
//        for NaN / +inf / -inf (one pass through the mapping); exit 1 when any is found
//
// Exit codes (tools/cli_util.h): 0 ok; 2 a usage error (flags, a budget below the
// minimum); 1 a file that cannot be read or is not what it should be, or --check found
// non-finite values.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <layerstream_version.h>  // LS_BACKENDS

#include "backend/backend.h"  // make_cpu_backend (the CPU's numerics resolution)
#include "core/arena.h"  // format_bytes
#include "exec/budget_plan.h"
#include "exec/planner.h"
#include "exec/plan.h"
#include "io/safetensors.h"
#include "model/h3/checkpoint.h"
#include "model/h3/config.h"
#include "model/h3/layout.h"
#include "model/h3/memory_table.h"
#include "model/h3/quant_census.h"
#include "sample/schedule.h"
#include "tools/command.h"
#include "tools/cli_util.h"
#include "tools/report.h"  // plan_paths

namespace ls::tools {
namespace {

using json = nlohmann::ordered_json;

constexpr const char* kCmd = "layerstream info";

struct InfoOptions {
  std::string file;
  std::string preset;
  FlagText blocks;
  bool adaln_curve = false;
  FlagText frames, width, height, text_tokens, slice_tokens;
  bool as_json = false;
  bool list_tensors = false;
  // Dry run.
  FlagText vram_budget, budget, kv_tile, sigma, steps;
  std::string device;
  CLI::Option* device_opt = nullptr;
  bool no_prefetch = false, keep_prefetch = false;
  NumericsFlags numerics;  // --attention, --gemm-f32 (and the developer variables)
  // Non-finite scan.
  bool check = false;
  // Device listing.
  bool devices = false;
};

int usage_error(const std::string& msg) { return report_error(kCmd, {ErrorCode::invalid_argument, msg}); }
int fail(const Error& e) { return report_error(kCmd, e); }


std::string with_commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) r += ',';
    r += s[i];
  }
  return v < 0 ? "-" + r : r;
}

std::string params_str(int64_t n) {
  char b[64];
  if (n >= 1000000000)
    std::snprintf(b, sizeof b, "%.2f B", static_cast<double>(n) / 1e9);
  else if (n >= 1000000)
    std::snprintf(b, sizeof b, "%.1f M", static_cast<double>(n) / 1e6);
  else if (n >= 1000)
    std::snprintf(b, sizeof b, "%.1f K", static_cast<double>(n) / 1e3);
  else
    std::snprintf(b, sizeof b, "%lld", static_cast<long long>(n));
  return b;
}

std::string shape_json_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// One tensor as the source holds it: declared spec plus stored dtype / bytes.
struct Held {
  const h3::TensorSpec* spec;
  DType stored;
  int64_t bytes;
};

// ---- --check: non-finite values ------------------------------------------------------

struct NonFinite {
  int64_t nan = 0, pos_inf = 0, neg_inf = 0;
  int64_t first = -1;  // element index of the first non-finite value, -1 when none
  int64_t total() const { return nan + pos_inf + neg_inf; }
};

// Counts by bit pattern, without converting: an IEEE value is non-finite iff its
// exponent field is all ones (kExp), a NaN iff a mantissa bit is set too (magnitude bits
// above kExp), an infinity iff exactly kExp, with the sign bit telling +inf from -inf.
// Words are read with memcpy (a tensor may sit misaligned in the mapping). Blocks of
// 4096 elements: the counting loop has no branch; the first index is located inside the
// first block that counted anything, so the data is read once.
template <typename U, U kExp, U kAbs>
void count_ieee(const unsigned char* p, int64_t n, NonFinite* r) {
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    int64_t nan = 0, inf = 0, neg = 0;
    for (int64_t i = b; i < e; ++i) {
      U w;
      std::memcpy(&w, p + static_cast<size_t>(i) * sizeof(U), sizeof(U));
      const U a = static_cast<U>(w & kAbs);
      nan += a > kExp;
      inf += a == kExp;
      neg += a == kExp && w != a;
    }
    if (nan + inf > 0 && r->first < 0)
      for (int64_t i = b; i < e && r->first < 0; ++i) {
        U w;
        std::memcpy(&w, p + static_cast<size_t>(i) * sizeof(U), sizeof(U));
        if (static_cast<U>(w & kAbs) >= kExp) r->first = i;
      }
    r->nan += nan;
    r->pos_inf += inf - neg;
    r->neg_inf += neg;
  }
}

// fp8 e4m3fn has no infinity; NaN is S.1111.111.
void count_f8e4m3(const unsigned char* p, int64_t n, NonFinite* r) {
  for (int64_t i = 0; i < n; ++i)
    if ((p[i] & 0x7F) == 0x7F) {
      if (r->first < 0) r->first = i;
      ++r->nan;
    }
}

// false for integer dtypes (nothing to scan: every value is finite).
bool scan_nonfinite(const unsigned char* p, DType t, int64_t n, NonFinite* r) {
  switch (t) {
    case DType::f64: count_ieee<uint64_t, 0x7FF0000000000000ull, 0x7FFFFFFFFFFFFFFFull>(p, n, r); return true;
    case DType::f32: count_ieee<uint32_t, 0x7F800000u, 0x7FFFFFFFu>(p, n, r); return true;
    case DType::bf16: count_ieee<uint16_t, 0x7F80, 0x7FFF>(p, n, r); return true;
    case DType::f16: count_ieee<uint16_t, 0x7C00, 0x7FFF>(p, n, r); return true;
    case DType::f8e4m3: count_f8e4m3(p, n, r); return true;
    case DType::i8:
    case DType::i32:
    case DType::u8: return false;
  }
  return false;
}

// `info --check FILE`: every tensor of any safetensors file (a checkpoint, a forward's
// output), one pass through the read-only mapping.
int run_check(const InfoOptions& o) {
  auto f = SafetensorsReader::open(o.file);
  if (!f.ok()) return fail(f.error());
  const SafetensorsReader& r = **f;
  // Advice only: read ahead and drop behind (a 66 GB checkpoint need not stay resident).
  if (!r.entries().empty()) {
    const auto& e0 = r.entries().front();
    const uintptr_t data = reinterpret_cast<uintptr_t>(r.data(e0)) - e0.begin;
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t base = data / page * page;
    madvise(reinterpret_cast<void*>(base), r.file_size() - r.data_start() + (data - base), MADV_SEQUENTIAL);
  }
  json bad = json::array();
  NonFinite all;
  int64_t tensors_bad = 0, scanned = 0, integer = 0;
  uint64_t elements = 0, bytes = 0;
  std::vector<std::string> lines;
  for (const SafetensorsEntry& e : r.entries()) {
    NonFinite nf;
    const int64_t n = e.numel();
    if (!scan_nonfinite(static_cast<const unsigned char*>(r.data(e)), e.dtype, n, &nf)) {
      ++integer;
      continue;
    }
    ++scanned;
    elements += static_cast<uint64_t>(n);
    bytes += e.end - e.begin;
    if (nf.total() == 0) continue;
    ++tensors_bad;
    all.nan += nf.nan, all.pos_inf += nf.pos_inf, all.neg_inf += nf.neg_inf;
    bad.push_back({{"name", e.name}, {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"nan", nf.nan},
                   {"pos_inf", nf.pos_inf}, {"neg_inf", nf.neg_inf}, {"first_index", nf.first}});
    char b[256];
    std::snprintf(b, sizeof b, "%s %s: NaN %lld, +inf %lld, -inf %lld (first at element %lld of %lld)",
                  dtype_name(e.dtype), shape_json_str(e.shape).c_str(), static_cast<long long>(nf.nan),
                  static_cast<long long>(nf.pos_inf), static_cast<long long>(nf.neg_inf),
                  static_cast<long long>(nf.first), static_cast<long long>(n));
    lines.push_back(e.name + "  " + b);
  }
  const int64_t total = static_cast<int64_t>(r.entries().size());
  std::string summary;
  if (all.total() == 0) {
    summary = "all " + std::to_string(scanned) + " floating-point tensors finite (" + std::to_string(elements) +
              " values, " + format_bytes(bytes) + ")";
  } else {
    summary = std::to_string(all.total()) + " non-finite values (NaN " + std::to_string(all.nan) + ", +inf " +
              std::to_string(all.pos_inf) + ", -inf " + std::to_string(all.neg_inf) + ") in " +
              std::to_string(tensors_bad) + " of " + std::to_string(scanned) + " floating-point tensors";
  }
  if (o.as_json) {
    json out = {{"file", o.file},
                {"tensors", total},
                {"scanned_tensors", scanned},
                {"integer_tensors", integer},
                {"scanned_values", elements},
                {"scanned_bytes", bytes},
                {"nonfinite", {{"values", all.total()}, {"nan", all.nan}, {"pos_inf", all.pos_inf},
                               {"neg_inf", all.neg_inf}, {"tensors", tensors_bad}}},
                {"nonfinite_tensors", bad},
                {"not_scanned", r.unsupported_tensors()},
                {"finite", all.total() == 0},
                {"summary", summary}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("checked     %s (%s): %lld tensors", o.file.c_str(), format_bytes(r.file_size()).c_str(),
                static_cast<long long>(total));
    if (integer > 0) std::printf(", %lld of them integer (nothing to check)", static_cast<long long>(integer));
    std::printf("\n");
    for (const auto& u : r.unsupported_tensors()) std::printf("not checked %s: a dtype LayerStream does not read\n", u.c_str());
    for (const auto& l : lines) std::printf("non-finite  %s\n", l.c_str());
    std::printf("result      %s\n", summary.c_str());
  }
  if (all.total() == 0) return 0;
  std::fprintf(stderr, "%s: error: %s holds %s (first: %s)\n", kCmd, o.file.c_str(), summary.c_str(),
               bad.front()["name"].get<std::string>().c_str());
  return kExitRuntime;
}

// ---- the activation tables: what a forward's activation arena holds -------------------

json buffer_json(const exec::PlannedBuffer& b) {
  return {{"what", b.what}, {"dtype", dtype_name(b.dtype)}, {"shape", std::vector<int64_t>{b.rows, b.cols}},
          {"bytes", b.bytes()}};
}

// The activation arena of the knobs plan with every slice `slice` rows (0: the stock
// plan), from exec::plan_memory: the persistent buffers, then each phase with every
// buffer live at its high point (persistent included in "bytes" and "live"); the peak
// is the plan's predicted peak (the arena's capacity, what forward measures).
Expected<json> activation_table_json(const h3::H3Config& cfg, const std::vector<h3::TensorSpec>& tensors,
                                     const h3::Conditioning& cond, int64_t slice) {
  exec::PlanRequest q;
  q.cfg = &cfg;
  q.tensors = &tensors;
  q.cond = &cond;
  q.knobs.attn_chunk_tokens = q.knobs.mlp_chunk_tokens = q.knobs.final_chunk_tokens = slice;
  q.knobs.kv_tile = 1024;  // buffer sizes do not depend on it (no K/V offload here)
  LS_ASSIGN_OR_RETURN(exec::PlanResult r, exec::plan_memory(q));
  const exec::Plan& p = r.plan;
  const uint64_t persistent = exec::sum_bytes(p.persistent);
  const exec::PlannedBuffer* x = exec::find_buffer(p.persistent, "residual x");
  json live0 = json::array();
  for (const auto& b : p.persistent) live0.push_back(buffer_json(b));
  json phases = json::array();
  const exec::PlanPhase* top = nullptr;
  for (const auto& ph : p.phases) {
    json live = live0;
    for (const auto& b : ph.buffers) live.push_back(buffer_json(b));
    phases.push_back({{"name", ph.name}, {"bytes", persistent + ph.bytes()}, {"phase_bytes", ph.bytes()}, {"live", live}});
    if (!top || ph.bytes() > top->bytes()) top = &ph;
  }
  LS_CHECK(top != nullptr && persistent + top->bytes() == p.predicted_peak_bytes);
  return json{{"plan", slice == 0 ? std::string("stock plan (all rows at once)")
                                  : "sliced plan (" + std::to_string(slice) + "-row slices, K/V resident)"},
              {"paths", plan_paths(p)},
              {"slice_tokens", slice},
              {"peak_bytes", p.predicted_peak_bytes},
              {"peak_phase", top->name},
              {"persistent_bytes", persistent},
              {"persistent_count", p.persistent.size()},
              {"residual_bytes", x ? x->bytes() : 0},
              {"phases", phases}};
}

// ---- dry run: what a budget would plan -------------------------------------------------

// The device a dry run plans for: a profile of plain numbers, never an opened device.
// The numerics (tools/cli_util.h numerics_from_flags_and_env) choose the attention
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

// The dry run for a clip: fills out["dry_run"]; returns the error a real run would stop
// with (out_of_budget below the minimum), or an ok Status. Usage errors come back as
// `usage` (the caller exits 2 before printing anything).
struct DryRun {
  json j;
  std::optional<Error> refused;  // the planner's refusal (the budget is below the minimum)
};

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

// One entry per device: the CPU, then cuda:0, cuda:1, ... until the driver says the index
// does not exist (each GPU is opened: a CUDA context each). The numerics are the
// backend's resolution of the flags given (default: auto) for an H3-shaped model (head
// dim 128) and for other head dims, since CUDA's auto depends on it (Backend::set_model_head_dim).
int run_devices(const InfoOptions& o) {
  auto nc = numerics_from_flags_and_env(kCmd, o.numerics, 0, /*quiet=*/true);
  if (!nc.ok()) return fail(nc.error());
  json list = json::array();
  std::string cuda_note;
  const auto describe_device = [&](Backend& be) {
    json d{{"device", be.device().str()}, {"name", be.name()}};
    uint64_t free_b = 0, total_b = 0;
    if (be.device().kind != DeviceKind::cpu && be.device_memory_info(&free_b, &total_b).ok())
      d["memory"] = {{"total_bytes", total_b}, {"free_bytes", free_b}};
    // The attention algorithms this device runs for an H3-shaped model (head dim 128): each
    // set alone (every other setting at its default), then the flags' numerics restored.
    json algos = json::array();
    for (const AttentionAlgorithm a : {AttentionAlgorithm::native, AttentionAlgorithm::cudnn, AttentionAlgorithm::hopper,
                                       AttentionAlgorithm::int8}) {
      Numerics t;
      t.attention = a;
      if (be.set_numerics(t, nc->diagnostics).ok() && be.set_model_head_dim(128).ok()) algos.push_back(to_string(a));
    }
    d["attention_algorithms"] = algos;
    if (Status st = be.set_numerics(nc->numerics, nc->diagnostics); !st.ok()) {
      d["error"] = st.message();
      return d;
    }
    for (const int64_t hd : {int64_t{128}, int64_t{64}}) {
      const std::string key = hd == 128 ? "numerics_head_dim_128" : "numerics_other_head_dims";
      if (Status st = be.set_model_head_dim(hd); !st.ok()) {
        d[key] = {{"error", st.message()}};
        continue;
      }
      d[key] = {{"line", describe(be.numerics())}, {"attention", to_string(be.numerics().attention)}};
    }
    return d;
  };
  auto cpu = make_backend("cpu", nc->numerics, nc->diagnostics);
  if (cpu.ok()) list.push_back(describe_device(**cpu));
  else list.push_back({{"device", "cpu"}, {"error", cpu.error().message}});  // e.g. --attention cudnn
  if (std::string(LS_BACKENDS).find("cuda") == std::string::npos) {
    cuda_note = "this build has no CUDA backend (backends: " LS_BACKENDS ")";
  } else {
    int usable = 0;
    for (int i = 0; i < 1024; ++i) {
      const std::string name = "cuda:" + std::to_string(i);
      auto be = make_backend(name, nc->numerics, nc->diagnostics);
      if (be.ok()) {
        list.push_back(describe_device(**be));
        ++usable;
        continue;
      }
      const std::string& why = be.error().message;
      if (why.find("does not exist") != std::string::npos) break;  // past the last device
      // A device that cannot be used (too old, the numerics refused there), or no driver
      // at all (then no further index can work either): listed with the reason.
      list.push_back({{"device", name}, {"error", why}});
      if (why.find("no usable CUDA device") != std::string::npos) break;
    }
    if (usable == 0) cuda_note = "no usable CUDA device";
  }
  json out{{"backends", LS_BACKENDS}, {"devices", list}};
  if (!cuda_note.empty()) out["note"] = cuda_note;
  if (o.as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("devices of this build (backends: %s)\n", LS_BACKENDS);
  for (const auto& d : list) {
    if (d.contains("error")) {
      std::printf("  %-24s unusable: %s\n", d["device"].get<std::string>().c_str(), d["error"].get<std::string>().c_str());
      continue;
    }
    std::printf("  %s", d["name"].get<std::string>().c_str());
    if (d.contains("memory"))
      std::printf(", %s total, %s free", format_bytes(d["memory"]["total_bytes"].get<uint64_t>()).c_str(),
                  format_bytes(d["memory"]["free_bytes"].get<uint64_t>()).c_str());
    std::printf("\n");
    std::string algos;
    for (const auto& x : d["attention_algorithms"]) algos += (algos.empty() ? "" : ", ") + x.get<std::string>();
    std::printf("    attention algorithms (head dim 128): %s\n", algos.c_str());
    const json& a = d["numerics_head_dim_128"];
    const json& b = d["numerics_other_head_dims"];
    const auto line = [](const json& n) {
      return n.contains("error") ? "refused: " + n["error"].get<std::string>() : n["line"].get<std::string>();
    };
    if (line(a) == line(b)) {
      std::printf("    numerics: %s\n", line(a).c_str());
    } else {
      std::printf("    numerics, head dim 128 (H3): %s\n", line(a).c_str());
      std::printf("    numerics, other head dims:   %s\n", line(b).c_str());
    }
  }
  if (!cuda_note.empty()) std::printf("  (%s)\n", cuda_note.c_str());
  std::fflush(stdout);
  return 0;
}

// Any flag that describes a model, a clip or a dry run (not FILE, --json, the numerics,
// --check, --devices): what --check and --devices refuse.
bool model_or_plan_flags(const InfoOptions& o) {
  return !o.preset.empty() || o.blocks.given() || o.adaln_curve || o.frames.given() || o.width.given() ||
         o.height.given() || o.text_tokens.given() || o.slice_tokens.given() || o.list_tensors ||
         o.vram_budget.given() || o.budget.given() || o.kv_tile.given() || o.sigma.given() || o.steps.given() ||
         o.device_opt->count() > 0 || o.no_prefetch || o.keep_prefetch;
}

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

  json out;
  h3::H3Config cfg;
  std::unique_ptr<h3::H3FileSource> file;
  std::vector<std::string> notes;
  std::vector<h3::TensorSpec> specs;
  std::vector<Held> held;
  if (!o.file.empty()) {
    if (o.blocks.given() || o.adaln_curve) return usage_error("--blocks and --adaln-curve go with --preset, not a file");
    auto f = h3::open_h3_checkpoint(o.file);
    if (!f.ok() && f.error().code == ErrorCode::unsupported) {
      // Stored dtypes that differ from the declared ones: say so, but still describe it.
      h3::OpenOptions lax;
      lax.allow_dtype_conversion = true;
      auto g = h3::open_h3_checkpoint(o.file, lax);
      if (g.ok()) {
        notes.push_back(f.error().message);
        f = std::move(g);
      }
    }
    if (!f.ok()) return fail(f.error());
    file = std::move(f).value();
    cfg = file->cfg();
    specs = file->specs();
    out["source"] = {{"kind", "file"}, {"path", o.file}, {"file_bytes", file->file().file_size()}};
    json md = json::object();
    for (const auto& [k, v] : file->file().metadata()) md[k] = v;
    out["metadata"] = md;
  } else {
    auto p = h3::h3_preset(o.preset);
    if (!p.ok()) return usage_error(p.error().message);
    cfg = *p;
    if (o.blocks.given()) {
      auto n = flag_int(o.blocks, range::blocks, cfg.num_layers);
      if (!n.ok()) return fail(n.error());
      cfg.num_layers = *n;
    }
    if (o.adaln_curve) cfg = h3::h3_curve_form(cfg);
    specs = h3::h3_tensor_specs(cfg);
    out["source"] = {{"kind", "preset"}, {"preset", o.preset}};
  }
  for (const auto& s : specs) {
    DType stored = s.dtype;
    if (file) stored = file->file().find(cfg.key_prefix + s.name)->dtype;
    held.push_back({&s, stored, s.numel() * dtype_size(stored)});
  }

  // ---- config, parameters and bytes by group ----------------------------------------
  out["config"] = json::parse(h3::h3_config_json(cfg));
  out["config"]["key_prefix"] = cfg.key_prefix;
  out["summary"] = h3::h3_config_summary(cfg);
  out["quant"] = h3::quant_census_json(h3::quant_census(cfg));  // formats by layer (issue 14)
  const h3::TensorSpec::Group groups[] = {h3::TensorSpec::Group::blocks, h3::TensorSpec::Group::adaln,
                                          h3::TensorSpec::Group::heads,  h3::TensorSpec::Group::refiner,
                                          h3::TensorSpec::Group::embed,  h3::TensorSpec::Group::other};
  json jg = json::object();
  int64_t total_params = 0, total_bytes = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> by_dtype;  // stored dtype -> tensors, bytes
  for (auto g : groups) {
    int64_t p = 0, b = 0, n = 0;
    for (const Held& h : held)
      if (h.spec->group == g) { p += h.spec->numel(); b += h.bytes; ++n; }
    if (n == 0) continue;
    jg[h3::group_name(g)] = {{"tensors", n}, {"params", p}, {"bytes", b}};
    total_params += p;
    total_bytes += b;
  }
  for (const Held& h : held) {
    auto& d = by_dtype[dtype_name(h.stored)];
    d.first += 1;
    d.second += h.bytes;
  }
  out["groups"] = jg;
  out["total"] = {{"tensors", static_cast<int64_t>(held.size())}, {"params", total_params}, {"bytes", total_bytes}};
  json jd = json::object();
  for (const auto& [k, v] : by_dtype) jd[k] = {{"tensors", v.first}, {"bytes", v.second}};
  out["dtypes"] = jd;
  // Per-block weight bytes that stream every step (the AdaLN projections are
  // precomputed once per schedule; DESIGN.md §2).
  int64_t block0_stream = 0;
  for (const Held& h : held)
    if (h.spec->group == h3::TensorSpec::Group::blocks && h.spec->name.rfind("blocks.0.", 0) == 0) block0_stream += h.bytes;
  out["block_streamed_weight_bytes"] = block0_stream;
  if (file) {
    out["unused_tensors"] = file->unused_keys();
  }
  out["notes"] = notes;
  if (o.list_tensors) {
    json jt = json::array();
    for (const Held& h : held)
      jt.push_back({{"name", h.spec->name},
                    {"group", h3::group_name(h.spec->group)},
                    {"dtype", dtype_name(h.stored)},
                    {"declared_dtype", dtype_name(h.spec->dtype)},
                    {"shape", h.spec->shape},
                    {"bytes", h.bytes}});
    out["tensors"] = jt;
  }

  // ---- clip -------------------------------------------------------------------------
  std::optional<Error> refused;  // the dry run's planner refused the budget
  if (clip_asked) {
    auto f = flag_int(o.frames, range::frames, 0);
    auto w = flag_int(o.width, range::width, 0);
    auto h = flag_int(o.height, range::height, 0);
    auto l = flag_int(o.text_tokens, range::text_tokens, 0);  // not given: no text rows (describing only)
    auto c = flag_int(o.slice_tokens, range::slice_tokens, 8192);
    for (auto* e : {&f, &w, &h, &l, &c})
      if (!e->ok()) return fail(e->error());
    auto g = h3::clip_geometry(*f, *w, *h, *l);
    if (!g.ok()) return fail(g.error());
    const int64_t S = g->tokens();
    out["clip"] = {{"frames_requested", *f}, {"frames", g->frames},         {"width", g->width},
                   {"height", g->height},    {"T", g->T},                   {"Hl", g->Hl},
                   {"Wl", g->Wl},            {"A", g->A},                   {"text_tokens", g->text_tokens},
                   {"video_tokens", g->video_tokens()}, {"audio_rows", g->audio_rows()}, {"S", S}};
    json jb = json::array();
    for (const auto& m : h3::h3_buffer_table(cfg, S, g->video_tokens()))
      jb.push_back({{"what", m.what}, {"dtype", dtype_name(m.dtype)}, {"shape", m.shape}, {"bytes", m.bytes()}});
    out["buffers"] = jb;
    // The activation arena of two plans, from the one planner (exec::plan_memory, knobs
    // mode): exactly the buffer lists forward allocates, per block phase.
    h3::Conditioning cond;
    cond.geometry = *g;
    json jp = json::array();
    for (const int64_t slice : {int64_t{0}, *c}) {
      auto t = activation_table_json(cfg, specs, cond, slice);
      if (!t.ok()) return fail(t.error());
      jp.push_back(std::move(*t));
    }
    out["block_memory"] = jp;
    if (planning) {
      auto d = dry_run(o, cfg, specs, *g, numerics);
      if (!d.ok()) return fail(d.error());
      out["dry_run"] = d->j;
      refused = d->refused;
    }
  }

  if (o.as_json) {
    std::printf("%s\n", out.dump(2).c_str());
    return refused ? fail(*refused) : 0;
  }

  // ---- text -------------------------------------------------------------------------
  if (file)
    std::printf("checkpoint  %s (%s)\n", o.file.c_str(), format_bytes(file->file().file_size()).c_str());
  else
    std::printf("preset      %s\n", o.preset.c_str());
  std::printf("config      %s\n", h3::h3_config_summary(cfg).c_str());
  std::printf("weights\n%s", h3::quant_census_text(h3::quant_census(cfg)).c_str());
  std::printf("form        %s\n", cfg.curve_form() ? "curve (pruned): AdaLN linears fp32, fed by adaln_t_table"
                                                    : "unpruned: time embedder, AdaLN linears bf16");
  if (file)
    for (const auto& [k, v] : file->file().metadata())
      std::printf("metadata    %s = %s\n", k.c_str(), v.size() > 120 ? (v.substr(0, 117) + "...").c_str() : v.c_str());
  for (const auto& n : notes) std::printf("note        %s\n", n.c_str());
  std::printf("\n%-10s %8s %14s %16s %12s\n", "group", "tensors", "parameters", "", "bytes");
  for (auto g : groups) {
    const char* n = h3::group_name(g);
    if (!jg.contains(n)) continue;
    const auto& e = jg[n];
    std::printf("%-10s %8lld %14s %16s %12s\n", n, static_cast<long long>(e["tensors"].get<int64_t>()),
                params_str(e["params"].get<int64_t>()).c_str(), with_commas(e["params"].get<int64_t>()).c_str(),
                format_bytes(static_cast<uint64_t>(e["bytes"].get<int64_t>())).c_str());
  }
  std::printf("%-10s %8zu %14s %16s %12s\n", "total", held.size(), params_str(total_params).c_str(),
              with_commas(total_params).c_str(), format_bytes(static_cast<uint64_t>(total_bytes)).c_str());
  std::printf("\nstored dtypes:");
  for (const auto& [k, v] : by_dtype)
    std::printf("  %s %lld tensors %s", k.c_str(), static_cast<long long>(v.first), format_bytes(static_cast<uint64_t>(v.second)).c_str());
  std::printf("\nstreamed weights per block (without AdaLN): %s\n", format_bytes(static_cast<uint64_t>(block0_stream)).c_str());
  if (file && !file->unused_keys().empty()) {
    std::printf("unused tensors: %zu (first: %s)\n", file->unused_keys().size(), file->unused_keys().front().c_str());
  }

  if (o.list_tensors) {
    std::printf("\n%-48s %-8s %-5s %-16s %12s\n", "tensor", "group", "dtype", "shape", "bytes");
    for (const Held& h : held)
      std::printf("%-48s %-8s %-5s %-16s %12s\n", (cfg.key_prefix + h.spec->name).c_str(), h3::group_name(h.spec->group),
                  dtype_name(h.stored), shape_json_str(h.spec->shape).c_str(),
                  format_bytes(static_cast<uint64_t>(h.bytes)).c_str());
  }

  if (clip_asked) {
    const auto& c = out["clip"];
    std::printf("\nclip        %lld frames (snapped from %lld), %lldx%lld, text tokens %lld\n",
                static_cast<long long>(c["frames"].get<int64_t>()), static_cast<long long>(c["frames_requested"].get<int64_t>()),
                static_cast<long long>(c["width"].get<int64_t>()), static_cast<long long>(c["height"].get<int64_t>()),
                static_cast<long long>(c["text_tokens"].get<int64_t>()));
    std::printf("latents     T %lld, Hl %lld, Wl %lld, A %lld\n", static_cast<long long>(c["T"].get<int64_t>()),
                static_cast<long long>(c["Hl"].get<int64_t>()), static_cast<long long>(c["Wl"].get<int64_t>()),
                static_cast<long long>(c["A"].get<int64_t>()));
    std::printf("tokens      S = %s (text %s + audio %s + video %s)\n", with_commas(c["S"].get<int64_t>()).c_str(),
                with_commas(c["text_tokens"].get<int64_t>()).c_str(), with_commas(c["audio_rows"].get<int64_t>()).c_str(),
                with_commas(c["video_tokens"].get<int64_t>()).c_str());
    std::printf("\n%-44s %-5s %-24s %16s %12s\n", "buffer", "dtype", "shape", "bytes", "");
    for (const auto& b : out["buffers"])
      std::printf("%-44s %-5s %-24s %16s %12s\n", b["what"].get<std::string>().c_str(), b["dtype"].get<std::string>().c_str(),
                  shape_json_str(b["shape"].get<std::vector<int64_t>>()).c_str(), with_commas(b["bytes"].get<int64_t>()).c_str(),
                  format_bytes(b["bytes"].get<uint64_t>()).c_str());
    for (const auto& bm : out["block_memory"]) {
      std::printf("\nactivations, %s: peak %s predicted (%s phase; persistent %s, of which residual x %s)\n",
                  bm["plan"].get<std::string>().c_str(), format_bytes(bm["peak_bytes"].get<uint64_t>()).c_str(),
                  bm["peak_phase"].get<std::string>().c_str(), format_bytes(bm["persistent_bytes"].get<uint64_t>()).c_str(),
                  format_bytes(bm["residual_bytes"].get<uint64_t>()).c_str());
      const size_t persistent_n = bm["persistent_count"].get<size_t>();
      const auto print_buffers = [](const json& live, size_t from, size_t to) {
        for (size_t i = from; i < to; ++i)
          std::printf(" %s %s%s;", live[i]["what"].get<std::string>().c_str(), live[i]["dtype"].get<std::string>().c_str(),
                      shape_json_str(live[i]["shape"].get<std::vector<int64_t>>()).c_str());
      };
      if (!bm["phases"].empty()) {
        std::printf("  %-10s %12s:", "persistent", format_bytes(bm["persistent_bytes"].get<uint64_t>()).c_str());
        print_buffers(bm["phases"][0]["live"], 0, persistent_n);
        std::printf("\n");
      }
      for (const auto& ph : bm["phases"]) {
        std::printf("  %-10s %12s:", ("+ " + ph["name"].get<std::string>()).c_str(),
                    format_bytes(ph["phase_bytes"].get<uint64_t>()).c_str());
        print_buffers(ph["live"], persistent_n, ph["live"].size());
        std::printf("\n");
      }
    }
    if (out.contains("dry_run")) print_dry_run(out["dry_run"]);
  }
  std::fflush(stdout);
  return refused ? fail(*refused) : 0;
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
                                 "with --budget); CUDA figures are the backend's documented defaults");
  add_int_flag(sub, "--kv-tile", o->kv_tile, range::kv_tile, "Dry run: keys per attention tile (numerics)",
               "the device's: 1024 on the CPU, 8192 with CUDA + cuDNN");
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
}  // namespace ls::tools
