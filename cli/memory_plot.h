// --memory-plot FILE.svg: device memory over a run, drawn as a stacked-area SVG.
// x: the phases of each block in run order; y: bytes, stacked by kind (weights, slots,
// activations, K/V, AdaLN tables, workspace); the budget (when one was given) as a line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "exec/engine.h"

namespace ls::cli {

struct MemoryPlotInput {
  std::string title;                          // e.g. "forward, S 8 234, --vram-budget 4 GiB"
  std::vector<exec::MemorySample> samples;    // in run order (several forwards: concatenated)
  uint64_t budget_bytes = 0;                  // 0 = no budget line
  uint64_t predicted_peak_bytes = 0;          // 0 = none; drawn as a dashed line
};

// The SVG text (self-contained, no scripts, no external references).
std::string memory_plot_svg(const MemoryPlotInput& in);
// Writes memory_plot_svg(in) to `path` (io::write_output_file policy).
Status write_memory_plot(const std::string& path, const MemoryPlotInput& in);

}  // namespace ls::cli
