// The benchmarks' command lines: each `--name VALUE` flag bound to a variable (or to a
// function of its value), `--help` / `-h` printing the usage text. An unknown flag, a
// missing value or one that does not parse is a message "PROG: ..." on stderr and the
// benchmark's failure exit status.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_json.h"

namespace ls::bench {

class Flags {
 public:
  // prog: the benchmark's name; usage: printed as is for --help; fail_code: the exit
  // status of a bad command line.
  Flags(std::string prog, std::string usage, int fail_code) :
      prog_(std::move(prog)), usage_(std::move(usage)), fail_code_(fail_code) {}

  Flags& text(const std::string& name, std::string& dst) {
    return with(name, [&dst](const std::string& v) { dst = v; });
  }
  Flags& integer(const std::string& name, int64_t& dst) {
    return with(name, [&dst](const std::string& v) { dst = std::stoll(v); });
  }
  Flags& integer(const std::string& name, int& dst) {
    return with(name, [&dst](const std::string& v) { dst = std::stoi(v); });
  }
  Flags& real(const std::string& name, float& dst) {
    return with(name, [&dst](const std::string& v) { dst = std::stof(v); });
  }
  // A comma list ("unlimited,8G,4G"; split_commas).
  Flags& list(const std::string& name, std::vector<std::string>& dst) {
    return with(name, [&dst](const std::string& v) { dst = split_commas(v); });
  }
  // Any other value: `set` parses it (a std::exception from it is a bad value).
  Flags& with(const std::string& name, std::function<void(const std::string&)> set) {
    setters_[name] = std::move(set);
    return *this;
  }

  void parse(int argc, char** argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string k = argv[i];
      if (k == "--help" || k == "-h") {
        std::fputs(usage_.c_str(), stdout);
        std::exit(0);
      }
      const auto it = setters_.find(k);
      if (it == setters_.end()) fail("unknown option " + k + " (see --help)");
      if (i + 1 >= argc) fail("missing value after " + k);
      const std::string v = argv[++i];
      try {
        it->second(v);
      } catch (const std::exception&) {
        fail("bad value '" + v + "' for " + k);
      }
    }
  }

  [[noreturn]] void fail(const std::string& m) const {
    std::fprintf(stderr, "%s: %s\n", prog_.c_str(), m.c_str());
    std::exit(fail_code_);
  }

 private:
  std::string prog_, usage_;
  int fail_code_;
  std::map<std::string, std::function<void(const std::string&)>> setters_;
};

}  // namespace ls::bench
