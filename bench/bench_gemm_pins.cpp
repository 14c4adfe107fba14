// The four bf16 linears of an H3 block (h3-model.md §2.9-2.11) at real width, timed
// alone on one backend: the data for choosing which cuBLASLt algorithm gemm.cu pins
// for each K (docs/cuda.md, "GEMM"). The pinned algorithm is chosen once per process,
// so a sweep runs this once per candidate:
//   for i in $(seq 0 15); do
//     LAYERSTREAM_GEMM_CANDIDATE=$i LAYERSTREAM_GEMM_VERBOSE=1 bench_gemm_pins --json g$i.json
//   done
// (LAYERSTREAM_GEMM_VERBOSE prints each pinned algorithm to stderr). Per GEMM: median
// time over --iters after --warmup (steady clock around backend synchronize(); each
// call is several ms), TFLOP/s; and the time of one whole block's linears at --S
// tokens from those rates. The inputs are random rows repeated (timing does not depend
// on the values, but all-zero data would run cooler than real data).
//
// Usage: bench_gemm_pins [--device cuda] [--M 32768] [--S 111274] [--iters 5]
//                        [--warmup 2] [--json out.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_args.h"
#include "bench_json.h"
#include "core/arena.h"
#include "core/dtype.h"

namespace {

using namespace ls;

constexpr int64_t D = 5376, I = 7168, F = 14336;

[[noreturn]] void die(const std::string& m) { bench::die("bench_gemm_pins", 1, m); }
void ok(const Status& s, const char* what) { if (!s.ok()) die(std::string(what) + ": " + s.message()); }

// 256 random rows uploaded, then repeated down the view by device copies.
void fill(Backend& b, const TensorView& v, uint32_t seed, float sd) {
  const int64_t rows = std::min<int64_t>(v.rows(), 256), cols = v.shape[1];
  std::vector<uint16_t> host(static_cast<size_t>(rows * cols));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  for (auto& h : host) h = f32_to_bf16(nd(rng));
  ok(b.copy(v.slice_rows(0, rows), TensorView(host.data(), DType::bf16, {rows, cols})), "upload");
  for (int64_t a = rows; a < v.rows(); a += rows) {
    const int64_t e = std::min(v.rows(), a + rows);
    ok(b.copy(v.slice_rows(a, e), v.slice_rows(0, e - a)), "replicate");
  }
  ok(b.synchronize(), "sync");
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cuda";
  bench::TimingArgs timing;
  timing.M = 32768;
  bench::Flags f("bench_gemm_pins",
                 "bench_gemm_pins [--device cuda] [--M 32768] [--S 111274] [--iters 5] [--warmup 2] [--json F]\n", 1);
  bench::add_timing(f.text("--device", device), timing).parse(argc, argv);
  bench::check_timing(f, timing);
  const int64_t M = timing.M, S = timing.S;
  const int iters = timing.iters, warmup = timing.warmup;
  const std::string& json_path = timing.json;
  std::vector<std::string> from_env;
  const std::unique_ptr<Backend> be = bench::developer_backend(f, device, from_env);
  Backend& b = *be;
  struct G {
    const char* name;
    int64_t N, K;
  };
  const G gs[] = {{"qkv", 3 * I, D}, {"out_proj", D, I}, {"fc1", 2 * F, D}, {"fc2", D, F}};
  size_t bytes = std::max<size_t>(b.workspace_bytes(), 256) + (size_t{64} << 20);
  for (const G& g : gs) bytes += static_cast<size_t>((g.N * g.K + M * g.K + M * g.N) * 2) + 4096;
  bench::BenchArena scratch(f, b, bytes);
  const auto take = [&](DType t, std::initializer_list<int64_t> dims, const char* what) {
    return scratch.take(t, dims, what);
  };
  ok(b.set_workspace(take(DType::u8, {static_cast<int64_t>(std::max<size_t>(b.workspace_bytes(), 256))}, "ws")),
     "set_workspace");
  nlohmann::json out;
  out["device"] = b.name();
  out["M"] = M;
  out["S"] = S;
  out["iters"] = iters;
  out["timing"] = "steady_clock around backend synchronize(), median";
  if (const std::string c = format_gemm_candidate(b.numerics().gemm_candidate); !c.empty())
    out["LAYERSTREAM_GEMM_CANDIDATE"] = c;  // the key earlier results used
  out["numerics"] = b.numerics();
  out["numerics_from_env"] = from_env;
  double block_ms = 0;
  uint32_t seed = 1;
  for (const G& g : gs) {
    TensorView w = take(DType::bf16, {g.N, g.K}, g.name), x = take(DType::bf16, {M, g.K}, "x"),
               y = take(DType::bf16, {M, g.N}, "y");
    fill(b, w, seed++, 1.0f / 64.0f);
    fill(b, x, seed++, 1.0f);
    std::vector<double> ts;
    for (int i = 0; i < warmup + iters; ++i) {
      ok(b.synchronize(), "sync");
      const auto t0 = std::chrono::steady_clock::now();
      ok(b.gemm(x, w, nullptr, y), g.name);
      ok(b.synchronize(), "sync");
      if (i >= warmup) ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ts.begin(), ts.end());
    const double t = ts[ts.size() / 2], flop = 2.0 * static_cast<double>(g.N) * static_cast<double>(g.K);
    const double tf = flop * static_cast<double>(M) / t / 1e12;
    block_ms += flop * static_cast<double>(S) / (tf * 1e12) * 1e3;
    out["gemms"][g.name] = {{"N", g.N}, {"K", g.K}, {"ms", t * 1e3}, {"tflops", tf}};
    std::printf("%-8s N %5lld K %5lld M %lld: %8.3f ms %6.1f TFLOP/s\n", g.name, static_cast<long long>(g.N),
                static_cast<long long>(g.K), static_cast<long long>(M), t * 1e3, tf);
  }
  out["block_linears_ms_at_S"] = block_ms;
  std::printf("the four linears of one block at S = %lld: %.1f ms\n", static_cast<long long>(S), block_ms);
  if (!json_path.empty() && !bench::write_json_text(json_path, out.dump(2) + "\n")) die("cannot write " + json_path);
  return 0;
}
