// Sets (or, with a null value, unsets) one environment variable for a scope and puts the
// old value back after: the tests that select a kernel path or variant
// (LAYERSTREAM_ATTENTION, LAYERSTREAM_ATTN_VARIANT) leave the process as they found it.
#pragma once

#include <cstdlib>
#include <string>

namespace ls::test {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) had_ = true, old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace ls::test
