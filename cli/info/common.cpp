// Helpers shared by the `info` files (cli/info/info.h).
#include <cstdio>

#include "cli/info/info.h"

namespace ls::cli::info {

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

}  // namespace ls::cli::info
