// JSON of plans, budget plans and the build, shared by the CLI's reports (cli/report.h
// forwards to these) and the C API's (ls_engine_plan, ls_engine_report_json), so the
// two never drift apart. nlohmann-json; field names are part of the report format.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "exec/budget_plan.h"
#include "exec/plan.h"

namespace ls::api {

// "two-pass attention (128-row slices), sliced MLP (128), sliced head (128)" or "stock plan (no slicing)".
std::string plan_paths(const exec::Plan& p);
// describe, paths, knobs, sizes, resolved slices, kv_tile, peaks, phases with buffers.
nlohmann::json plan_json(const exec::Plan& p);
// The total-budget planner's choice: budget, step, residency, offloads, predicted peak,
// PCIe per forward and the one-line description.
nlohmann::json budget_plan_json(const exec::BudgetPlan& bp);
// {"version": "0.1.0", "git_commit": "2b1192f0c3a1", "build_type": "Release", "backends": ["cpu", "cuda"]}
nlohmann::json version_json();
// "layerstream 0.1.0 (commit 2b1192f0c3a1, Release build, backends: cpu, cuda)"
std::string version_line();

}  // namespace ls::api
