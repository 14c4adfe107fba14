// Run reports of `layerstream generate`: the one status line printed after a run and
// the full JSON written by --json.
//
// Status line (one line, like ComfyUI's memory-patch nodes):
//   [LayerStream] sliced: two-pass attention (128-row slices), sliced MLP (128), sliced head (128);
//   S 554, kv_tile 1024; activation peak 1.02 MiB measured / 1.02 MiB predicted vs stock 3.41 MiB
//   (-70.1 %); AdaLN tables 13.5 KiB precomputed; 4 steps x 1 forward = 4 forwards in 1.93 s
//   (0.48 s/forward) on cpu
// "measured" is the largest activation-arena high-water mark over every forward of the
// run; "predicted" the plan's (the larger of the two prompts' plans with CFG).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "core/status.h"
#include "exec/budget_plan.h"
#include "sample/generate.h"

namespace ls::cli {

// Output fingerprints are ls::fnv1a64 (core/hash.h), printed with hex64.
std::string hex64(uint64_t v);

// Peak figures of a run, over all its forwards and both prompts' plans.
struct RunPeaks {
  uint64_t measured = 0;   // max arena high-water mark
  uint64_t predicted = 0;  // max plan prediction
  uint64_t stock = 0;      // the stock plan's prediction (max over the prompts)
};
RunPeaks run_peaks(const sample::GenerateResult& r);

// "two-pass attention (128-row slices), sliced MLP (128), sliced head (128)" or "stock plan (no slicing)".
std::string plan_paths(const exec::Plan& p);

std::string generate_status_line(const std::string& label, const sample::GenerateResult& r);

// The JSON of one run: plan(s), timings, every forward's RunReport, output fingerprints.
nlohmann::json run_json(const std::string& label, const sample::GenerateResult& r);
nlohmann::json plan_json(const exec::Plan& p);
// The total-budget planner's choice (--vram-budget): budget, step, residency, offloads,
// predicted peak, PCIe per forward and the one-line description.
nlohmann::json budget_plan_json(const exec::BudgetPlan& bp);

// Writes `j` (pretty) to `path` under the output-file policy (io::write_output_file:
// atomic replace of a regular file or a new path, written through to a character
// device, anything else refused). `what` names the flag in messages.
Status write_json_file(const std::string& path, const nlohmann::json& j, std::string_view what = "--json");

// The build, from the generated <layerstream_version.h>: what `layerstream --version`
// prints and every JSON report carries as "version".
//   {"version": "0.1.0", "git_commit": "2b1192f0c3a1", "build_type": "Release", "backends": ["cpu", "cuda"]}
nlohmann::json version_json();
// "layerstream 0.1.0 (commit 2b1192f0c3a1, Release build, backends: cpu, cuda)"
std::string version_line();

// NaN and infinite values among n floats.
int64_t count_nonfinite(const float* p, size_t n);
// The non-finite values of a run's video and audio outputs (`what`: "output", "positive
// latents"): their count, after a warning on stderr when `allow` (--allow-nonfinite);
// without it, a nonfinite error naming the counts ("nothing written").
Expected<int64_t> check_outputs_finite(const char* cmd, const std::vector<float>& video, const std::vector<float>& audio,
                                       const std::string& what, bool allow);
// A run that failed on a non-finite value (ErrorCode::nonfinite): its message also says
// that nothing was written, and how to write it anyway unless it names that already.
Error nothing_written(Error e);

// The backend in a file's metadata: its kind ("cpu", "cuda"), not the device index or
// name, which do not change a bit of the output.
std::string backend_kind(const std::string& backend_name);

}  // namespace ls::cli
