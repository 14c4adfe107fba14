// Placeholder so the CLI links while the renderer is written (helper E replaces this).
#include "tools/memory_plot.h"

namespace ls::tools {

std::string memory_plot_svg(const MemoryPlotInput&) { return std::string(); }

Status write_memory_plot(const std::string& path, const MemoryPlotInput&) {
  return make_error(ErrorCode::unsupported, "--memory-plot " + path + ": not built yet");
}

}  // namespace ls::tools
