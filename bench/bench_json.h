// Writing a benchmark's JSON result: to PATH.tmp first, then renamed over PATH, so a run
// cut short (or a full disk) never leaves a half-written result behind.
#pragma once

#include <cstdio>
#include <fstream>
#include <string>

namespace ls::bench {

// False when the file cannot be written (the caller says so and exits).
inline bool write_json_text(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp);
  f << text;
  f.close();
  if (!f || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace ls::bench
