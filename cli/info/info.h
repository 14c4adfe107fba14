// `layerstream info`, shared by its files (one per subcommand, issue 27 item 4):
//   cli/cmd_info.cpp         the flags, their validation and the dispatch;
//   cli/info/describe.cpp    a checkpoint or preset, and a clip's tokens and memory;
//   cli/info/dry_run.cpp     --vram-budget / --budget: what a budget would plan;
//   cli/info/check.cpp       --check FILE: every tensor scanned for NaN / inf;
//   cli/info/devices.cpp     --devices: the CPU and every CUDA GPU with its numerics.
// What each prints is described in cli/cmd_info.cpp.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/numerics.h"
#include "core/status.h"
#include "exec/budget_plan.h"
#include "model/h3/config.h"
#include "cli/cli_util.h"

namespace ls::cli::info {

using json = nlohmann::ordered_json;

inline constexpr const char* kCmd = "layerstream info";

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

// "layerstream info: error: MSG" with exit code 2 (usage) / the error's exit code.
int usage_error(const std::string& msg);
int fail(const Error& e);

// 1,234,567; "33.19 B" / "12.3 M" parameters; "[1, 2, 3]".
std::string with_commas(int64_t v);
std::string params_str(int64_t n);
std::string shape_json_str(const std::vector<int64_t>& s);

// --check FILE (cli/info/check.cpp).
int run_check(const InfoOptions& o);
// --devices (cli/info/devices.cpp).
int run_devices(const InfoOptions& o);

// The dry run (cli/info/dry_run.cpp). The device planned for: a profile of plain
// numbers, never an opened device.
Expected<exec::DeviceProfile> dry_run_device(const std::string& device, bool vram, const Numerics& numerics);
// The dry run for a clip: its JSON, and the error a real run would stop with
// (out_of_budget below the minimum) in `refused`.
struct DryRun {
  json j;
  std::optional<Error> refused;  // the planner's refusal (the budget is below the minimum)
};
Expected<DryRun> dry_run(const InfoOptions& o, const h3::H3Config& cfg, const std::vector<h3::TensorSpec>& tensors,
                         const h3::ClipGeometry& g, const Numerics& numerics);
void print_dry_run(const json& d);

// A checkpoint or preset, and with a clip its tokens, buffers, activation tables and the
// dry run (cli/info/describe.cpp); the flags are validated by the caller.
int run_describe(const InfoOptions& o, const Numerics& numerics);

}  // namespace ls::cli::info
