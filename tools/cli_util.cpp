#include "tools/cli_util.h"

#include <cctype>

namespace ls::tools {

Expected<int64_t> parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi) {
  size_t used = 0;
  long long v = 0;
  bool ok = !text.empty() && std::isdigit(static_cast<unsigned char>(text[0])) != 0;
  if (ok) {
    try {
      v = std::stoll(text, &used);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok || used != text.size() || v < lo || v > hi)
    return make_error(ErrorCode::invalid_argument, flag + " must be an integer in " + std::to_string(lo) + ".." +
                                                       std::to_string(hi) + " (got '" + text + "')");
  return static_cast<int64_t>(v);
}

}  // namespace ls::tools
