// Issue 26, side by side in one process on one GPU: attention int8 on the Hopper kernel
// (attention_hopper_int8.cu, what the CUDA backend runs on sm_90), on the portable kernel
// (attention_int8.cu, forced with cuda::set_int8_attention_kernel), and the bf16 attention
// algorithms hopper and cudnn (where built), at S queries = S keys, 56 heads x 128 (H3's
// width), non-causal. TOP/s by the bf16 kernel's FLOP count 4 S^2 H Dh ("equivalent" for
// int8). Also: the key statistics + prepare time, and the two int8 kernels' full outputs
// compared byte for byte on the GPU (cuda::count_unequal), since they must be equal.
// On sm_90 the Hopper kernel is timed in both launches, persistent (the default) and one CTA
// per (query tile, head) ("hopper-grid", the launch before session 14), outputs compared.
// Inputs: counter-hashed approximate normal(0, 1) bf16 with two outlier channels in K (+12).
// Each timed call after one warm-up; the median and the best of --reps.
//   bench_int8_kernels [--s N] [--reps R] [--out FILE.json] [--no-portable] [--no-bf16] [--table]
//                      [--chunked ROWS]
// (--table: also the Hopper kernel with p8 by the table path, cuda::set_int8_p8_path;
// --chunked ROWS: the first ROWS queries against all S keys, in one call and in key chunks of
// 4,096 / 8,192 / 16,384 / 32,768 keys carrying the fp32 state as K/V offload's pass 2 does,
// each chunked output compared byte for byte with the one-call output: the cost per call of
// a query slice and of its key chunks, for the Hopper int8 kernel (both launches), the portable one unless
// --no-portable, and the bf16 kernels unless --no-bf16, in chunks of whole kv_tiles)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_ext.h"
#include "bench_json.h"
#include "core/arena.h"
#include "core/dtype.h"

using namespace ls;

namespace {

float approx_normal(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  const float u = static_cast<float>((z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48));
  return (u / 65536.0f - 2.0f) * 1.7320508f;
}

void check(const Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_int8_kernels: %s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t S = 111274, reps = 3, chunked = 0;
  bool portable = true, bf16 = true, table = false;
  std::string out = "bench_int8_kernels.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-portable") {
      portable = false;
      continue;
    }
    if (a == "--table") {
      table = true;
      continue;
    }
    if (a == "--no-bf16") {
      bf16 = false;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "missing value after %s\n", a.c_str());
      return 2;
    }
    if (a == "--s") S = std::atoll(argv[i + 1]);
    else if (a == "--reps") reps = std::max<int64_t>(1, std::atoll(argv[i + 1]));
    else if (a == "--out") out = argv[i + 1];
    else if (a == "--chunked") chunked = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
    ++i;
  }
  const int64_t H = 56, Dh = 128, I = H * Dh;
  Numerics n;
  n.attention = AttentionAlgorithm::int8;
  auto be = make_backend("cuda", n, {});
  if (!be.ok()) {
    std::fprintf(stderr, "bench_int8_kernels: %s\n", be.error().message.c_str());
    return 1;
  }
  Backend& b = **be;
  const int64_t kb = int8_keys_bytes(S, H, Dh);
  auto arena = Arena::create(b.memory(), static_cast<size_t>(5 * S * I * 2 + kb + (1ll << 30)));
  if (!arena.ok()) {
    std::fprintf(stderr, "bench_int8_kernels: %s\n", arena.error().message.c_str());
    return 1;
  }
  auto alloc = [&](DType t, std::initializer_list<int64_t> d) {
    auto v = (*arena)->alloc(t, d, "bench");
    LS_CHECK(v.ok());
    return *v;
  };
  const TensorView q = alloc(DType::bf16, {S, H, Dh}), k = alloc(DType::bf16, {S, H, Dh}),
                   v = alloc(DType::bf16, {S, H, Dh}), o_h = alloc(DType::bf16, {S, H, Dh}),
                   o_p = alloc(DType::bf16, {S, H, Dh});
  const TensorView stats = alloc(DType::f32, {2 + int8_stat_blocks(S), H, Dh}), kbuf = alloc(DType::u8, {kb});
  const TensorView vs = alloc(DType::f32, {int8_stat_blocks(S), 2, H, Dh});
  const TensorView counter = alloc(DType::f64, {1});
  const Int8Keys keys = int8_keys_view(kbuf.data, S, H, Dh, kbuf.device, vs);
  {
    const int64_t rows = 8192;
    std::vector<uint16_t> h(static_cast<size_t>(rows * I));
    uint64_t seed = 1;
    for (const TensorView* t : {&q, &k, &v}) {
      for (int64_t r0 = 0; r0 < S; r0 += rows) {
        const int64_t r1 = std::min(S, r0 + rows), cnt = (r1 - r0) * I;
        const unsigned nt = std::max(1u, std::thread::hardware_concurrency());
        std::vector<std::thread> pool;
        for (unsigned w = 0; w < nt; ++w)
          pool.emplace_back([&, w] {
            for (int64_t i = w; i < cnt; i += nt) {
              const int64_t c = i % Dh;
              const float x = approx_normal(seed, static_cast<uint64_t>(r0 * I + i)) +
                              (t == &k && (c == 1 || c == 67) ? 12.0f : 0.0f);
              h[static_cast<size_t>(i)] = f32_to_bf16(x);
            }
          });
        for (auto& th : pool) th.join();
        check(b.copy(t->slice_rows(r0, r1), TensorView(h.data(), DType::bf16, {r1 - r0, H, Dh})), "upload");
      }
      ++seed;
    }
  }
  struct Timing {
    double median = 0, best = 0;
  };
  auto time = [&](auto&& fn) {
    check(fn(), "warm-up");
    check(b.synchronize(), "synchronize");
    std::vector<double> t;
    for (int64_t r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      check(fn(), "timed call");
      check(b.synchronize(), "synchronize");
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return Timing{t[t.size() / 2], t[0]};
  };
  const double flop = 4.0 * static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(I);
  const auto tops = [&](double s) { return flop / s / 1e12; };
  std::string rows;
  const auto row = [&](const std::string& name, const std::string& numerics, const Timing& t) {
    std::printf("%-28s median %9.2f ms  best %9.2f ms  %7.1f TOP/s (median)  %7.1f (best)\n", name.c_str(),
                1e3 * t.median, 1e3 * t.best, tops(t.median), tops(t.best));
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "%s    {\"kernel\": \"%s\", \"numerics\": \"%s\", \"median_seconds\": %.6f, \"best_seconds\": %.6f, "
                  "\"tops_bf16_flop_count_median\": %.1f, \"tops_bf16_flop_count_best\": %.1f}",
                  rows.empty() ? "" : ",\n", name.c_str(), bench::json_escape(numerics).c_str(), t.median, t.best,
                  tops(t.median), tops(t.best));
    rows += buf;
  };
  AttentionParams p;
  p.kv_tile = b.numerics().kv_tile;
  const Timing prep = time([&]() -> Status {
    LS_TRY(b.int8_key_stats(k, v, stats, 0, true));
    return b.int8_prepare(k, v, stats, keys);
  });
  std::printf("int8 statistics + prepare     median %9.2f ms\n", 1e3 * prep.median);
  const std::string auto_kernel = cuda::int8_attention_kernel(b);
  const std::string p8_path = cuda::int8_p8_path(b), p8_check = cuda::int8_p8_check_summary(b);
  std::printf("int8 p8 path %s (check: %s)\n", p8_path.c_str(), p8_check.c_str());
  row("int8_" + auto_kernel, describe(b.numerics()) + " p8 " + p8_path,
      time([&]() { return b.attention_int8(q, keys, o_h, p); }));
  if (table) {
    check(cuda::set_int8_p8_path(b, "table"), "p8 table");
    row("int8_" + auto_kernel + "_p8table", describe(b.numerics()) + " p8 table",
        time([&]() { return b.attention_int8(q, keys, o_p, p); }));
    check(cuda::set_int8_p8_path(b, "auto"), "p8 auto");
  }
  // The Hopper kernel's two launches (persistent: one CTA per SM over the (query tile, head)
  // items, the default; grid: one CTA per item, the launch before session 14), byte for byte.
  int64_t grid_unequal = -1;
  const bool hopper = auto_kernel == "hopper";
  if (hopper) {
    check(cuda::set_int8_attention_kernel(b, "hopper-grid"), "hopper-grid");
    row("int8_hopper_grid", describe(b.numerics()) + " p8 " + p8_path,
        time([&]() { return b.attention_int8(q, keys, o_p, p); }));
    check(cuda::set_int8_attention_kernel(b, "auto"), "auto");
  }
  // Outputs compared on the GPU, byte for byte (bf16 [rows_n, I]).
  const auto count_diff = [&](const TensorView& x, const TensorView& y, int64_t rows_n) {
    std::vector<int64_t> zero{0};
    check(b.copy(counter, TensorView(zero.data(), DType::f64, {1})), "counter");
    const TensorView a2(x.data, DType::bf16, {rows_n, I}, x.device), b2(y.data, DType::bf16, {rows_n, I}, y.device);
    check(cuda::count_unequal(b, a2, b2, counter), "count_unequal");
    check(b.copy(TensorView(zero.data(), DType::f64, {1}), counter), "counter");
    check(b.synchronize(), "synchronize");
    return zero[0];
  };
  if (hopper) {
    grid_unequal = count_diff(o_h, o_p, S);
    std::printf("int8 hopper persistent vs grid: %lld of %lld outputs differ\n", static_cast<long long>(grid_unequal),
                static_cast<long long>(S * I));
  }
  if (portable) {
    check(cuda::set_int8_attention_kernel(b, "portable"), "portable");
    row("int8_portable", describe(b.numerics()) + " p8 " + p8_path,
        time([&]() { return b.attention_int8(q, keys, o_p, p); }));
    check(cuda::set_int8_attention_kernel(b, "auto"), "auto");
  }
  // The same kernel on the first `chunked` queries: one call, then key chunks with the state.
  std::string chunk_rows;
  // The two int8 outputs, byte for byte.
  int64_t unequal = -1;
  if (portable) unequal = count_diff(o_h, o_p, S);
  // (after the comparison above: this reuses o_p)
  // The first `chunked` queries against all S keys with one kernel: one call, then key chunks
  // (whole kv_tiles) carrying the fp32 state as K/V offload's pass 2 does, each chunked
  // output compared byte for byte with the one-call output. call(k0, k1, out, params) attends
  // the queries to keys [k0, k1).
  using ChunkCall = std::function<Status(int64_t, int64_t, const TensorView&, const AttentionParams&)>;
  // The queries and one state buffer for every kernel (the arena's spare GiB also holds the
  // bf16 workspace).
  const int64_t nq = std::min(S, chunked);
  const TensorView chunk_q = q.slice_rows(0, nq);
  const TensorView chunk_state = chunked > 0 ? alloc(DType::f32, {nq, H, Dh + kAttentionStateExtra}) : TensorView();
  const auto time_chunked = [&](const std::string& name, const AttentionParams& base, const ChunkCall& call) {
    const TensorView on = o_h.slice_rows(0, nq), pn = o_p.slice_rows(0, nq);
    const double fl = 4.0 * static_cast<double>(nq) * static_cast<double>(S) * static_cast<double>(I);
    const Timing one = time([&]() { return call(0, S, on, base); });
    std::printf("chunked %s: %lld queries x %lld keys, one call   median %8.2f ms  %7.1f TOP/s\n", name.c_str(),
                static_cast<long long>(nq), static_cast<long long>(S), 1e3 * one.median, fl / one.median / 1e12);
    for (const int64_t c : {int64_t{4096}, int64_t{8192}, int64_t{16384}, int64_t{32768}}) {
      if (c % base.kv_tile != 0) continue;  // chunks are whole tiles (bf16 hopper / cudnn: 8,192 keys)
      const int64_t nc = (S + c - 1) / c;
      const Timing t = time([&]() -> Status {
        for (int64_t j = 0; j < nc; ++j) {
          AttentionParams pc = base;
          pc.state = chunk_state;
          pc.state_in = j > 0;
          pc.finalize = j == nc - 1;
          LS_TRY(call(j * c, std::min(S, (j + 1) * c), pn, pc));
        }
        return Status();
      });
      const int64_t d = count_diff(on, pn, nq);
      std::printf("chunked %s: %5lld-key chunks (%3lld calls)        median %8.2f ms  %7.1f TOP/s  x%.3f one call, "
                  "%.3f ms per call more; %lld outputs differ\n",
                  name.c_str(), static_cast<long long>(c), static_cast<long long>(nc), 1e3 * t.median, fl / t.median / 1e12,
                  t.median / one.median, 1e3 * (t.median - one.median) / static_cast<double>(nc), static_cast<long long>(d));
      char buf[320];
      std::snprintf(buf, sizeof buf,
                    "%s    {\"kernel\": \"%s\", \"queries\": %lld, \"chunk_keys\": %lld, \"calls\": %lld, \"median_seconds\": %.6f, "
                    "\"one_call_median_seconds\": %.6f, \"unequal_outputs\": %lld}",
                    chunk_rows.empty() ? "" : ",\n", name.c_str(), static_cast<long long>(nq), static_cast<long long>(c),
                    static_cast<long long>(nc), t.median, one.median, static_cast<long long>(d));
      chunk_rows += buf;
    }
  };
  // Every int8 kernel measured above (the portable one too, unless --no-portable): the fixed
  // cost per call is each kernel's own (its prologue and the state round trip).
  std::vector<std::string> chunk_kernels;
  if (chunked > 0) chunk_kernels.push_back(auto_kernel);
  if (chunked > 0 && hopper) chunk_kernels.push_back("hopper-grid");
  if (chunked > 0 && portable) chunk_kernels.push_back("portable");
  for (const std::string& ck : chunk_kernels) {
    check(cuda::set_int8_attention_kernel(b, ck == auto_kernel ? "auto" : ck), "chunked kernel");
    time_chunked(ck, p, [&](int64_t k0, int64_t k1, const TensorView& dst, const AttentionParams& pc) {
      return b.attention_int8(chunk_q, keys.slice(k0, k1), dst, pc);
    });
  }
  if (!chunk_kernels.empty()) check(cuda::set_int8_attention_kernel(b, "auto"), "auto");
  std::printf("int8 %s vs portable: %lld of %lld outputs differ\n", auto_kernel.c_str(), static_cast<long long>(unequal),
              static_cast<long long>(S * I));
  for (const AttentionAlgorithm a : {AttentionAlgorithm::hopper, AttentionAlgorithm::cudnn}) {
    if (!bf16) break;
    Numerics nb;
    nb.attention = a;
    if (!b.set_numerics(nb, {}).ok()) {
      std::printf("bf16 %s: not available here\n", to_string(a));
      continue;
    }
    const size_t wsb = std::max<size_t>(b.workspace_bytes(), 256);
    auto ws = (*arena)->alloc(DType::u8, {static_cast<int64_t>(wsb)}, "workspace");
    if (!ws.ok() || !b.set_workspace(*ws).ok()) {
      std::printf("bf16 %s: no workspace\n", to_string(a));
      continue;
    }
    AttentionParams pb;
    pb.kv_tile = b.numerics().kv_tile;
    row(std::string("bf16_") + to_string(a), describe(b.numerics()), time([&]() { return b.attention(q, k, v, o_p, pb); }));
    if (chunked > 0) {  // bf16 K/V offload's pass 2 (its default chunk: 8,192 keys at kv_tile 8,192)
      time_chunked(std::string("bf16_") + to_string(a), pb,
                   [&](int64_t k0, int64_t k1, const TensorView& dst, const AttentionParams& pc) {
                     return b.attention(chunk_q, k.slice_rows(k0, k1), v.slice_rows(k0, k1), dst, pc);
                   });
    }
    check(b.set_workspace(TensorView()), "unset workspace");
  }
  std::string json = "{\n  \"bench\": \"int8_kernels\",\n  \"device\": \"" + bench::json_escape(b.name()) +
                     "\",\n  \"S\": " + std::to_string(S) + ",\n  \"heads\": " + std::to_string(H) +
                     ",\n  \"head_dim\": " + std::to_string(Dh) + ",\n  \"reps\": " + std::to_string(reps) +
                     ",\n  \"flop_count\": \"4 S^2 H Dh\",\n  \"int8_p8_path\": \"" + p8_path + "\",\n  \"int8_p8_check\": \"" +
                     bench::json_escape(p8_check) + "\",\n  \"int8_prepare_median_seconds\": " +
                     std::to_string(prep.median) + ",\n  \"int8_hopper_vs_portable_unequal_outputs\": " +
                     std::to_string(unequal) + ",\n  \"int8_hopper_persistent_vs_grid_unequal_outputs\": " +
                     std::to_string(grid_unequal) + ",\n  \"runs\": [\n" + rows + "\n  ],\n  \"chunked\": [\n" + chunk_rows +
                     "\n  ]\n}\n";
  if (!bench::write_json_text(out, json)) {
    std::fprintf(stderr, "bench_int8_kernels: cannot write %s\n", out.c_str());
    return 1;
  }
  return (!portable || unequal == 0) && grid_unequal <= 0 ? 0 : 3;
}
