#include "core/status.h"

namespace ls {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument: return "invalid argument";
    case ErrorCode::invalid_file: return "invalid file";
    case ErrorCode::io: return "I/O error";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::out_of_budget: return "over budget";
    case ErrorCode::out_of_memory: return "out of memory";
    case ErrorCode::device: return "device error";
    case ErrorCode::not_found: return "not found";
    case ErrorCode::nonfinite: return "non-finite values";
  }
  return "unknown error";
}

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "layerstream: internal check failed: %s at %s:%d%s%s\n", expr, file, line,
               msg.empty() ? "" : ": ", msg.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ls
