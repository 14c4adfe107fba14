// Writing a benchmark's JSON result: to PATH.tmp first, then renamed over PATH, so a run
// cut short (or a full disk) never leaves a half-written result behind; and the small
// text helpers the budget benchmarks share.
#pragma once

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

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

// 16 hex digits (an output hash as the CLI prints it).
inline std::string hex16(uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016" PRIx64, h);
  return b;
}

// A string for a hand-written JSON value: quotes and backslashes escaped.
inline std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    o += c;
  }
  return o;
}

// A comma list ("unlimited,8G,4G"), empty items dropped.
inline std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');)
    if (!t.empty()) v.push_back(t);
  return v;
}

}  // namespace ls::bench
