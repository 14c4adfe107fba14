// layerstream: the command-line front end. Subcommands live in cli/cmd_*.cpp.
//
// Exit codes (every command): 0 ok; 2 a usage error (unknown or contradictory flags,
// bad values, a budget below the clip's minimum), found before any work starts; 1 any
// failure at run time (files, I/O, device, memory, non-finite values).
//
// Only the CLI reads the environment, never the library. The developer variables that
// change numerics (LAYERSTREAM_ATTENTION, _GEMM_F32, _ATTN_VARIANT, _CUDNN_QCHUNK, ...)
// are mapped onto ls::Numerics by cli/cli_util.h numerics_from_flags_and_env, next to
// the --attention / --gemm-f32 flags (add_numerics_flags), with a notice on stderr.
// LAYERSTREAM_TEST_FAIL_ALLOC=k (a developer / test variable): the k-th allocation of the run (host arena, pinned,
// device; counted from 1) fails as if memory were exhausted (ls::testing::
// arm_allocation_fault), to check that every such failure is a clean error, exit 1, with
// no output file left behind.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <new>

#include "core/alloc_fault.h"
#include "cli/cli_util.h"
#include "cli/command.h"
#include "cli/report.h"

namespace ls::cli {
std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> r;
  return r;
}
}  // namespace ls::cli

int main(int argc, char** argv) {
  using namespace ls::cli;
  CLI::App app{
      "LayerStream: runs the MiniMax H3 audio-video diffusion transformer on long clips inside a fixed memory "
      "budget, with output that no memory setting changes by a single bit.\n"
      "Sizes are 1024-based (512M = 512 MiB, 3G = 3 GiB). Exit codes: 0 ok, 2 usage error, 1 failure at run time."};
  app.set_version_flag("--version", version_line(), "print the version, git commit, build type and backends, then exit");
  app.require_subcommand(1);
  app.get_formatter()->column_width(44);
  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](const CommandInfo& a, const CommandInfo& b) { return a.name < b.name; });
  std::map<CLI::App*, CommandRun> runs;
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    runs[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version print and exit 0; every real parse error (unknown flag,
    // missing value, a required flag absent) is a usage error: exit code 2.
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUsage;
  }
  if (const char* k = std::getenv("LAYERSTREAM_TEST_FAIL_ALLOC"); k != nullptr) {
    auto n = parse_int("LAYERSTREAM_TEST_FAIL_ALLOC", k, IntRange{0, INT64_MAX});
    if (!n.ok()) return report_error("layerstream", n.error());
    ls::testing::arm_allocation_fault(*n);
  }
  for (auto& [sub, run] : runs) {
    if (!sub->parsed()) continue;
    try {
      return run();
    } catch (const std::bad_alloc&) {
      // A host allocation outside the arenas (std::vector of inputs or outputs). Outputs
      // are written atomically, so nothing half-written is left.
      std::fprintf(stderr, "layerstream %s: error: out of host memory\n", sub->get_name().c_str());
      return kExitRuntime;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "layerstream %s: error: %s\n", sub->get_name().c_str(), e.what());
      return kExitRuntime;
    }
  }
  return kExitUsage;
}
