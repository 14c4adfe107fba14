// The four linears of an H3 block (qkv 5376->21504, out_proj 7168->5376, fc1 5376->28672,
// fc2 14336->5376) at real width on CUDA, in each weight format, side by side (issue 14):
//   bf16       Backend::gemm (the pinned cuBLASLt bf16 GEMM; fc2: after the swiglu op, as the
//              bf16 block runs it; bf16_gemm_only: the GEMM alone)
//   int8       Backend::linear int8_convrot, the whole op (quantiser with FHT, int32 GEMM,
//              epilogue; fc2 takes the fused swiglu input u [M, 28672]) and the int8 GEMM
//              alone (cuda::bench_quant_gemm_only: int8 tensor cores, int32 out)
//   fp8        Backend::linear fp8_e4m3 (static activation scale 1; the whole op; fc2: after
//              the swiglu op) and the fp8 GEMM alone (fp32 out)
// Per linear, the stages around the GEMM alone ("stages": the activation quantiser and the
// epilogue of int8 and fp8, with the bytes each moves as GB/s), so the whole op splits into
// quantise + GEMM + epilogue.
// Per linear and format: median ms over --iters after --warmup at M = --M rows (steady clock
// around synchronize()), and TFLOP/s (bf16, fp8) or TOP/s (int8), 2 M N K operations. The
// block figure at S = --S tokens is timed, not extrapolated from rates: S is walked in
// slices of --M rows as the executor does (floor(S / M) slices of M rows and one of the
// rest), each slice shape timed once. The inputs are random rows repeated (timing does not
// depend on the values; all-zero data would run cooler).
//
// Build: a CUDA build (LAYERSTREAM_CUDA=ON, LAYERSTREAM_BENCH=ON).
// Usage: bench_linear_quant [--M 8192] [--S 111274] [--iters 5] [--warmup 2] [--json out.json]
// (LAYERSTREAM_GEMM_VERBOSE=1 prints the pinned algorithms.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cuda/linear_quant_bench.cuh"
#include "bench_args.h"
#include "bench_json.h"
#include "core/arena.h"
#include "core/dtype.h"

namespace {

using namespace ls;

constexpr int64_t D = 5376, I = 7168, F = 14336;

[[noreturn]] void die(const std::string& m) { bench::die("bench_linear_quant", 1, m); }
void ok(const Status& s, const char* what) { if (!s.ok()) die(std::string(what) + ": " + s.message()); }

// 256 random rows uploaded, then repeated down the view by device copies. gen(i) gives
// element i of the first rows as the storage type's bytes.
template <typename T>
void fill(Backend& b, const TensorView& v, const std::function<T(std::mt19937&)>& gen, uint32_t seed) {
  const int64_t rows = std::min<int64_t>(v.rows(), 256), cols = v.shape[1];
  std::vector<T> host(static_cast<size_t>(rows * cols));
  std::mt19937 rng(seed);
  for (auto& h : host) h = gen(rng);
  ok(b.copy(v.slice_rows(0, rows), TensorView(host.data(), v.dtype, {rows, cols})), "upload");
  for (int64_t a = rows; a < v.rows(); a += rows) {
    const int64_t e = std::min(v.rows(), a + rows);
    ok(b.copy(v.slice_rows(a, e), v.slice_rows(0, e - a)), "replicate");
  }
  ok(b.synchronize(), "sync");
}

double median_ms(Backend& b, int warmup, int iters, const std::function<Status()>& fn, const char* what) {
  std::vector<double> ts;
  for (int i = 0; i < warmup + iters; ++i) {
    ok(b.synchronize(), "sync");
    const auto t0 = std::chrono::steady_clock::now();
    ok(fn(), what);
    ok(b.synchronize(), "sync");
    if (i >= warmup) ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2] * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  bench::TimingArgs timing;
  timing.M = 8192;
  bench::Flags f("bench_linear_quant", "bench_linear_quant [--M 8192] [--S 111274] [--iters 5] [--warmup 2] [--json F]\n", 1);
  bench::add_timing(f, timing).parse(argc, argv);
  bench::check_timing(f, timing);
  const int64_t M = timing.M, S = timing.S;
  const int iters = timing.iters, warmup = timing.warmup;
  const std::string& json_path = timing.json;
  std::vector<std::string> from_env;
  const std::unique_ptr<Backend> be = bench::developer_backend(f, "cuda", from_env);
  Backend& b = *be;

  struct Lin {
    const char* name;
    int64_t N, K;
    bool swiglu;  // int8: x is u [M, 2K]
  };
  const Lin ls_[] = {{"qkv", 3 * I, D, false}, {"out_proj", D, I, false}, {"fc1", 2 * F, D, false}, {"fc2", D, F, true}};
  const size_t ws = b.workspace_bytes();
  size_t bytes = ws + (size_t{64} << 20);
  for (const Lin& l : ls_) {
    const size_t N = static_cast<size_t>(l.N), K = static_cast<size_t>(l.K), m = static_cast<size_t>(M);
    // weights bf16 + i8 + e4m3, x bf16 [M, 2K], q [M, K], y bf16, acc 4 bytes [M, N]
    bytes += N * K * 4 + m * K * 4 + m * K * 3 + m * N * 2 + m * N * 4 + N * 8 + m * 4 + (size_t{1} << 17);
  }
  bench::BenchArena scratch(f, b, bytes);
  const auto take = [&](DType t, std::initializer_list<int64_t> dims, const char* what) {
    return scratch.take(t, dims, what);
  };
  Arena& ar = scratch.arena();
  ok(b.set_workspace(take(DType::u8, {static_cast<int64_t>(ws)}, "workspace")), "set_workspace");

  nlohmann::json out;
  out["device"] = b.name();
  out["M"] = M;
  out["S"] = S;
  out["iters"] = iters;
  out["warmup"] = warmup;
  out["timing"] = "steady_clock around backend synchronize(), median";
  out["numerics"] = b.numerics();
  out["numerics_from_env"] = from_env;
  const int64_t full_slices = S / M, last = S % M;
  out["slices_at_S"] = {{"rows", M}, {"count", full_slices}, {"last_rows", last}};
  // ms at S of: the bf16 linear, int8, fp8, the int8 GEMM alone, the bf16 GEMM alone. For
  // fc2 "bf16" and "fp8" include the swiglu op before the GEMM (what those blocks run; int8
  // fuses it into its quantiser), "bf16_gemm_only" does not.
  constexpr int kF = 5;
  double block[kF] = {0, 0, 0, 0, 0};
  const char* fmt_names[kF] = {"bf16", "int8", "fp8", "int8_gemm_only", "bf16_gemm_only"};
  uint32_t seed = 1;
  auto bf16_gen = [](float sd) {
    return std::function<uint16_t(std::mt19937&)>([sd](std::mt19937& r) {
      std::normal_distribution<float> nd(0.0f, sd);
      return f32_to_bf16(nd(r));
    });
  };
  for (const Lin& l : ls_) {
    Arena::Scope scope(ar);
    const int64_t xk = l.swiglu ? 2 * l.K : l.K;
    TensorView wb = take(DType::bf16, {l.N, l.K}, "w bf16"), wi = take(DType::i8, {l.N, l.K}, "w i8"),
               wf = take(DType::f8e4m3, {l.N, l.K}, "w e4m3"), x = take(DType::bf16, {M, xk}, "x"),
               y = take(DType::bf16, {M, l.N}, "y"), q = take(DType::i8, {M, l.K}, "q"),
               acc = take(DType::i32, {M, l.N}, "acc"), sw = take(DType::f32, {l.N}, "sw"),
               act = take(DType::bf16, {M, l.K}, "swiglu out"),
               sf = take(DType::f32, {1}, "s_w");
    fill<uint16_t>(b, wb, bf16_gen(1.0f / 64.0f), seed++);
    fill<uint16_t>(b, x, bf16_gen(1.0f), seed++);
    fill<int8_t>(b, wi, [](std::mt19937& r) { return static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(r)); }, seed++);
    fill<int8_t>(b, q, [](std::mt19937& r) { return static_cast<int8_t>(std::uniform_int_distribution<int>(-127, 127)(r)); }, seed++);
    fill<uint8_t>(b, wf, [](std::mt19937& r) { return f32_to_f8e4m3(std::normal_distribution<float>(0.0f, 50.0f)(r)); }, seed++);
    {
      std::vector<float> s(static_cast<size_t>(l.N), 0.01f);
      ok(b.copy(sw, TensorView(s.data(), DType::f32, {l.N})), "upload sw");
      ok(b.copy(sf, TensorView(s.data(), DType::f32, {1})), "upload s_w");
    }
    LinearWeight li8;
    li8.format = WeightFormat::int8_convrot;
    li8.w = wi;
    li8.scale = sw;
    li8.group = 256;
    LinearWeight lf8;
    lf8.format = WeightFormat::fp8_e4m3;
    lf8.w = wf;
    lf8.scale = sf;
    LinearOptions o8;
    o8.swiglu_input = l.swiglu;
    const double ops = 2.0 * static_cast<double>(l.N) * static_cast<double>(l.K);
    nlohmann::json& j = out["linears"][l.name];
    j["N"] = l.N;
    j["K"] = l.K;
    // per format: the op on rows [0, m)
    auto timed = [&](int fi, int64_t m) -> double {
      const TensorView xm = x.slice_rows(0, m), ym = y.slice_rows(0, m), am = act.slice_rows(0, m);
      // the bf16 / fp8 input: swiglu(u) for fc2, else x
      auto input = [&]() -> Status { return l.swiglu ? b.swiglu(xm, am) : Status(); };
      const TensorView in = l.swiglu ? am : xm;
      switch (fi) {
        case 0:
          return median_ms(b, warmup, iters, [&]() -> Status {
            LS_TRY(input());
            return b.gemm(in, wb, nullptr, ym);
          }, "bf16 gemm");
        case 1: return median_ms(b, warmup, iters, [&] { return b.linear(xm, li8, nullptr, ym, o8); }, "int8 linear");
        case 2:
          return median_ms(b, warmup, iters, [&]() -> Status {
            LS_TRY(input());
            return b.linear(in, lf8, nullptr, ym);
          }, "fp8 linear");
        case 4: return median_ms(b, warmup, iters, [&] { return b.gemm(xm.cols(0, l.K), wb, nullptr, ym); }, "bf16 gemm");
        default:
          return median_ms(b, warmup, iters,
                           [&] { return cuda::bench_quant_gemm_only(b, false, q.slice_rows(0, m), wi, acc.slice_rows(0, m)); },
                           "int8 gemm");
      }
    };
    for (int fi = 0; fi < kF; ++fi) {
      const double t = timed(fi, M);
      const double rate = ops * static_cast<double>(M) / (t * 1e-3) / 1e12;
      const double t_last = last > 0 ? timed(fi, last) : 0.0;
      const double at_s = static_cast<double>(full_slices) * t + t_last;
      block[fi] += at_s;
      j[fmt_names[fi]] = {{"ms", t}, {fi == 1 || fi == 3 ? "tops" : "tflops", rate}, {"ms_at_S", at_s}};
      std::printf("%-8s N %5lld K %5lld M %lld %-15s %8.3f ms %7.1f %s   (S = %lld: %8.2f ms)\n", l.name,
                  static_cast<long long>(l.N), static_cast<long long>(l.K), static_cast<long long>(M), fmt_names[fi], t,
                  rate, fi == 1 || fi == 3 ? "TOP/s" : "TFLOP/s", static_cast<long long>(S), at_s);
    }
    // The stages around the GEMM alone (the split of the whole op: activation quantiser,
    // GEMM, epilogue), at M rows: int8 (FHT + absmax + quantise; fc2 with the swiglu input)
    // and fp8 (static scale); the epilogues from the acc buffer.
    {
      TensorView rs = take(DType::f32, {M}, "row scales");
      TensorView accl = acc;  // [M, ld] with ld = N rounded up to 4 (N is a multiple of 4 here)
      TensorView qf = q;
      qf.dtype = DType::f8e4m3;
      TensorView accf = acc;
      accf.dtype = DType::f32;
      const TensorView ym = y.slice_rows(0, M), in = l.swiglu ? act : x;
      const double ms_q8 = median_ms(b, warmup, iters, [&] { return cuda::bench_quant_activations(b, x, li8, l.swiglu, q, rs); },
                                     "int8 quantiser");
      const double ms_e8 = median_ms(b, warmup, iters, [&] { return cuda::bench_quant_epilogue(b, accl, rs, li8, ym); },
                                     "int8 epilogue");
      const double ms_qf = median_ms(b, warmup, iters, [&] { return cuda::bench_quant_activations(b, in, lf8, false, qf, rs); },
                                     "fp8 quantiser");
      const double ms_ef = median_ms(b, warmup, iters, [&] { return cuda::bench_quant_epilogue(b, accf, rs, lf8, ym); },
                                     "fp8 epilogue");
      // bytes each stage moves at these M rows (reads + writes), for the rate against HBM
      const double xkd = static_cast<double>(xk), mK = static_cast<double>(M) * static_cast<double>(l.K),
                   mN = static_cast<double>(M) * static_cast<double>(l.N);
      const double b_q8 = static_cast<double>(M) * xkd * 2 + mK, b_qf = mK * 2 + mK, b_e = mN * 4 + mN * 2;
      j["stages"] = {{"int8_quantise_ms", ms_q8}, {"int8_quantise_gb_per_s", b_q8 / (ms_q8 * 1e-3) / 1e9},
                     {"int8_epilogue_ms", ms_e8}, {"int8_epilogue_gb_per_s", b_e / (ms_e8 * 1e-3) / 1e9},
                     {"fp8_quantise_ms", ms_qf}, {"fp8_quantise_gb_per_s", b_qf / (ms_qf * 1e-3) / 1e9},
                     {"fp8_epilogue_ms", ms_ef}, {"fp8_epilogue_gb_per_s", b_e / (ms_ef * 1e-3) / 1e9}};
      std::printf("%-8s stages at M %lld: int8 quantise %.3f ms (%.0f GB/s), epilogue %.3f ms (%.0f GB/s); "
                  "fp8 quantise %.3f ms (%.0f GB/s), epilogue %.3f ms (%.0f GB/s)\n",
                  l.name, static_cast<long long>(M), ms_q8, b_q8 / (ms_q8 * 1e-3) / 1e9, ms_e8, b_e / (ms_e8 * 1e-3) / 1e9,
                  ms_qf, b_qf / (ms_qf * 1e-3) / 1e9, ms_ef, b_e / (ms_ef * 1e-3) / 1e9);
    }
    // the fp8 GEMM alone (fp32 accumulators in the acc buffer)
    {
      TensorView qf = q, accf = acc;
      qf.dtype = DType::f8e4m3;
      accf.dtype = DType::f32;
      const double t = median_ms(b, warmup, iters, [&] { return cuda::bench_quant_gemm_only(b, true, qf, wf, accf); },
                                 "fp8 gemm");
      j["fp8_gemm_only"] = {{"ms", t}, {"tflops", ops * static_cast<double>(M) / (t * 1e-3) / 1e12}};
      std::printf("%-8s %-24s %8.3f ms %7.1f TFLOP/s\n", l.name, "fp8_gemm_only", t,
                  ops * static_cast<double>(M) / (t * 1e-3) / 1e12);
    }
  }
  for (int fi = 0; fi < kF; ++fi) {
    out["block_linears_ms_at_S"][fmt_names[fi]] = block[fi];
    std::printf("four linears of one block at S = %lld, %s: %.1f ms (%.3fx bf16)\n", static_cast<long long>(S),
                fmt_names[fi], block[fi], block[fi] / block[0]);
  }
  if (!json_path.empty() && !bench::write_json_text(json_path, out.dump(2) + "\n")) die("cannot write " + json_path);
  return 0;
}
