// CPU reference ops: GEMM GFLOP/s and attention throughput (Google Benchmark).
//
//   build-x/bench/bench_cpu_ops --benchmark_out=cpu_ops.json --benchmark_out_format=json
//
// Every case runs with 1 thread (the per-core figure) and with all threads
// (ls::set_num_threads(0)); the last argument is the thread count (0 = all). Times are
// wall-clock (UseRealTime): the work runs on the ops' thread pool, so the main
// thread's CPU time would undercount. Counters: GFLOP/s = 2*M*N*K (GEMM) or
// 4*Mq*Mk*H*Dh (attention: QK^T and PV) per second; for attention also
// query-heads/s. With 1 thread also GFLOP/cpu_s: flops per CPU second of the one
// thread doing the work, the per-core rate that a loaded machine does not distort.
// Inputs are random bf16 in [-1, 1].
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/thread_pool.h"

namespace {

using namespace ls;

struct Buffer {
  std::vector<uint8_t> bytes;
  TensorView view;
  Buffer(DType t, std::initializer_list<int64_t> dims, uint64_t seed) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    bytes.resize(static_cast<size_t>(n * dtype_size(t)));
    view = TensorView(bytes.data(), t, dims);
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int64_t i = 0; i < n; ++i) store_from_f32(view.data, t, i, dist(rng));
  }
};

Backend& cpu() {
  static std::unique_ptr<Backend> b = make_cpu_backend();
  return *b;
}

// CPU seconds of the calling thread. With 1 thread, parallel_for runs the whole op on
// the calling thread, so flops / this = the per-core rate even on a loaded machine.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void per_core_counter(benchmark::State& state, double flops_per_iter, double cpu_seconds) {
  if (num_threads() == 1 && cpu_seconds > 0)
    state.counters["GFLOP/cpu_s"] = flops_per_iter * static_cast<double>(state.iterations()) * 1e-9 / cpu_seconds;
}

void set_threads(benchmark::State& state, int64_t arg) {
  set_num_threads(static_cast<int>(arg));
  state.counters["threads"] = num_threads();
}

// Args: M, N, K, x dtype (0 bf16, 1 f32), threads
void BM_Gemm(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const DType xt = state.range(3) == 0 ? DType::bf16 : DType::f32;
  set_threads(state, state.range(4));
  Buffer x(xt, {M, K}, 1), w(xt, {N, K}, 2), out(xt, {M, N}, 3), bias(DType::f32, {N}, 4);
  const double t0 = thread_cpu_seconds();
  for (auto _ : state) {
    if (!cpu().gemm(x.view, w.view, &bias.view, out.view).ok()) state.SkipWithError("gemm failed");
    benchmark::DoNotOptimize(out.bytes.data());
  }
  const double cpu_s = thread_cpu_seconds() - t0;
  const double flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  per_core_counter(state, flops, cpu_s);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(xt == DType::bf16 ? "bf16" : "f32");
  set_num_threads(0);
}

// Args: Mq (= Mk), H, Dh, kv_tile, threads
void BM_Attention(benchmark::State& state) {
  const int64_t S = state.range(0), H = state.range(1), Dh = state.range(2);
  set_threads(state, state.range(4));
  const int64_t I = H * Dh;
  Buffer qkv(DType::bf16, {S, 3 * I}, 5), out(DType::bf16, {S, I}, 6);
  const TensorView q = qkv.view.cols(0, I).unflatten_last(H, Dh);
  const TensorView k = qkv.view.cols(I, 2 * I).unflatten_last(H, Dh);
  const TensorView v = qkv.view.cols(2 * I, 3 * I).unflatten_last(H, Dh);
  AttentionParams p;
  p.kv_tile = state.range(3);
  const double t0 = thread_cpu_seconds();
  for (auto _ : state) {
    if (!cpu().attention(q, k, v, out.view.unflatten_last(H, Dh), p).ok()) state.SkipWithError("attention failed");
    benchmark::DoNotOptimize(out.bytes.data());
  }
  const double cpu_s = thread_cpu_seconds() - t0;
  const double flops = 4.0 * static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(I);
  per_core_counter(state, flops, cpu_s);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["query_heads/s"] =
      benchmark::Counter(static_cast<double>(S * H), benchmark::Counter::kIsIterationInvariantRate);
  set_num_threads(0);
}

void gemm_args(benchmark::internal::Benchmark* b) {
  for (int64_t threads : {1, 0}) {
    // bf16 block linears at K = 512 .. 5376 (qkv / fc1 / out_proj / fc2 shapes, narrowed N)
    for (int64_t K : {512, 2048, 5376}) b->Args({64, 1024, K, 0, threads});
    b->Args({256, 1024, 5376, 0, threads});
    // few-row slices (column-parallel path)
    b->Args({1, 5376, 5376, 0, threads});
    b->Args({8, 5376, 5376, 0, threads});
    // fp32 island: time embedder proj_in (K = 256)
    b->Args({16, 5376, 256, 1, threads});
  }
}

void attention_args(benchmark::internal::Benchmark* b) {
  for (int64_t threads : {1, 0}) b->Args({1024, 2, 128, 1024, threads});
  b->Args({1024, 2, 128, 128, 0});
}

BENCHMARK(BM_Gemm)->Apply(gemm_args)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Attention)->Apply(attention_args)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
