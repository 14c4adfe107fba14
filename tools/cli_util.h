// Small helpers shared by the tools/cmd_*.cpp subcommands.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace ls::tools {

// A decimal integer flag value in [lo, hi]; anything else (sign, spaces, trailing
// text, overflow) is an invalid_argument naming the flag, the range and the text.
Expected<int64_t> parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi);

}  // namespace ls::tools
