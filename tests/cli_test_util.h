// Helpers shared by the CLI end-to-end tests (test_exec_forward_cli, test_cli_generate).
#pragma once

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

}  // namespace ls::test
