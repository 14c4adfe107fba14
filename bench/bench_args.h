// The benchmarks' command lines: each `--name VALUE` flag bound to a variable (or to a
// function of its value), `--help` / `-h` printing the usage text. An unknown flag, a
// missing value or one that does not parse is a message "PROG: ..." on stderr and the
// benchmark's failure exit status. Also the flag groups several benchmarks share, the
// backend with the developer variables, and an arena for a benchmark's tensors.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "bench_json.h"

namespace ls::bench {

// A benchmark's failure: "PROG: message" on stderr, exit status `code`.
[[noreturn]] inline void die(const std::string& prog, int code, const std::string& m) {
  std::fprintf(stderr, "%s: %s\n", prog.c_str(), m.c_str());
  std::exit(code);
}

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

  [[noreturn]] void fail(const std::string& m) const { die(prog_, fail_code_, m); }

 private:
  std::string prog_, usage_;
  int fail_code_;
  std::map<std::string, std::function<void(const std::string&)>> setters_;
};

// The whole-model benchmarks' model and clip (bench_budget, bench_multi_gpu): add_model_clip
// binds their flags, kModelClipUsage is their lines of the usage text.
struct ModelClipArgs {
  std::string preset = "h3";
  int64_t blocks = 0, frames = 362, width = 1024, height = 1024, text_tokens = 500;
  float sigma = 0.9f;
};
inline constexpr const char* kModelClipUsage =
    "  --preset NAME       tiny | small | h3 (default h3)\n"
    "  --blocks N          fewer blocks at full width (default: the preset's)\n"
    "  --frames/--width/--height/--text-tokens  clip (default 362 1024 1024 500: S = 111,274)\n"
    "  --sigma X           the call's sigma (default 0.9)\n";
inline Flags& add_model_clip(Flags& f, ModelClipArgs& a) {
  return f.text("--preset", a.preset)
      .integer("--blocks", a.blocks)
      .integer("--frames", a.frames)
      .integer("--width", a.width)
      .integer("--height", a.height)
      .integer("--text-tokens", a.text_tokens)
      .real("--sigma", a.sigma);
}

// The linear benchmarks' timing (bench_gemm_pins, bench_linear_quant): --M rows a call,
// --S tokens of the block figure, --iters timed calls (the median) after --warmup, --json.
struct TimingArgs {
  int64_t M = 8192, S = 111274;
  int iters = 5, warmup = 2;
  std::string json;
};
inline Flags& add_timing(Flags& f, TimingArgs& t) {
  return f.integer("--M", t.M).integer("--S", t.S).integer("--iters", t.iters).integer("--warmup", t.warmup).text(
      "--json", t.json);
}
// After parse: the values in range, else the failure.
inline void check_timing(const Flags& f, const TimingArgs& t) {
  if (t.M < 1 || t.S < 1 || t.iters < 1 || t.warmup < 0) f.fail("--M, --S, --iters must be >= 1, --warmup >= 0");
}

// The backend `device` with the developer variables (LAYERSTREAM_GEMM_CANDIDATE,
// LAYERSTREAM_GEMM_VERBOSE, ...) read here and handed to it as numerics (src/ reads no
// environment); from_env: the variables that were set. A failure is the flags' failure.
inline std::unique_ptr<Backend> developer_backend(const Flags& f, const std::string& device,
                                                  std::vector<std::string>& from_env) {
  Numerics numerics;
  Diagnostics diagnostics;
  const Status vars = apply_developer_variables([](const char* n) -> const char* { return std::getenv(n); },
                                                &numerics, &diagnostics, &from_env);
  if (!vars.ok()) f.fail(vars.message());
  auto be = make_backend(device, numerics, diagnostics);
  if (!be.ok()) f.fail(be.error().message);
  return std::move(*be);
}

// A device arena of `bytes` on b for a benchmark's tensors: take() allocates from it; a
// failure is the flags' failure.
class BenchArena {
 public:
  BenchArena(const Flags& f, Backend& b, size_t bytes) : f_(f) {
    auto a = Arena::create(b.memory(), bytes);
    if (!a.ok()) f.fail(a.error().message);
    arena_ = std::move(*a);
  }
  TensorView take(DType t, std::initializer_list<int64_t> dims, const char* what) {
    auto r = arena_->alloc(t, dims, what);
    if (!r.ok()) f_.fail(r.error().message);
    return r.value();
  }
  Arena& arena() { return *arena_; }

 private:
  const Flags& f_;
  std::unique_ptr<Arena> arena_;
};

}  // namespace ls::bench
