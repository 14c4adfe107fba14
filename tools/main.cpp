// layerstream: the command-line front end. Subcommands live in tools/cmd_*.cpp.
#include <algorithm>
#include <cstdio>
#include <map>

#include "tools/command.h"

namespace ls::tools {
std::vector<CommandInfo>& command_registry() {
  static std::vector<CommandInfo> r;
  return r;
}
}  // namespace ls::tools

int main(int argc, char** argv) {
  using namespace ls::tools;
  CLI::App app{
      "LayerStream: runs the MiniMax H3 audio-video diffusion transformer on long clips inside a fixed memory "
      "budget, with output that no memory setting changes by a single bit."};
  app.require_subcommand(1);
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
    // missing value, bad number) is a usage error: exit code 2, as all commands use.
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  for (auto& [sub, run] : runs)
    if (sub->parsed()) return run();
  return 1;
}
