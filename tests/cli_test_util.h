// Helpers shared by the CLI end-to-end tests (test_exec_forward_cli, test_cli_generate,
// test_cli_flags, test_cli_outputs, ...): they run the built binary (LS_TOOL_PATH).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace ls::test {

// The byte count in a refusal such as "... the smallest total budget that works is
// 18.5 MiB (19410432 bytes: ...)"; -1 when the message does not name one.
inline long long named_minimum_budget(const std::string& message) {
  const auto at = message.find("the smallest total budget that works is ");
  if (at == std::string::npos) return -1;
  const auto lp = message.find('(', at), sp = message.find(" bytes", lp);
  if (lp == std::string::npos || sp == std::string::npos) return -1;
  return std::stoll(message.substr(lp + 1, sp - lp - 1));
}

// Runs `layerstream ARGS` (ARGS as a shell would split them) with stdout and stderr
// together (stderr dropped when !merge_stderr); `env` is prepended
// ("LAYERSTREAM_TEST_FAIL_ALLOC=3").
struct ToolRun {
  int code = -1;    // the exit status; -1 when killed by a signal
  std::string out;  // stdout and stderr
};
inline ToolRun run_tool(const std::string& args, const std::string& env = "", bool merge_stderr = true) {
  const std::string cmd =
      (env.empty() ? "" : env + " ") + std::string(LS_TOOL_PATH) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  ToolRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The 16 hex digits after "output hash " in a run's output ("" when absent).
inline std::string output_hash(const ToolRun& r) {
  const std::string key = "output hash ";
  const size_t at = r.out.find(key);
  return at == std::string::npos ? "" : r.out.substr(at + key.size(), 16);
}

// True when the binary has the CUDA backend and a device runs a tiny forward: the
// --vram-budget tests (a device budget; refused on the CPU backend) run only then.
inline bool cuda_usable() {
  static const int usable = [] {
    if (run_tool("--version").out.find("cuda") == std::string::npos) return 0;
    return run_tool("forward --preset tiny --frames 5 --width 32 --height 32 --text-tokens 1 --sigma 1 --device cuda -q")
                       .code == 0
               ? 1
               : 0;
  }();
  return usable != 0;
}

}  // namespace ls::test
