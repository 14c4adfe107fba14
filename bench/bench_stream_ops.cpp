// What K/V offload costs on a device, piece by piece (issue 5), at H3 width (H 56,
// Dh 128): attention of Mq queries against S keys in ONE call vs in chunks of `chunk`
// keys carrying the fp32 state (AttentionParams::state), with K/V already on the device
// (the kernel's own cost of chunking); host -> device and device -> host bandwidth from
// pinned memory on the transfer queue, alone and while the chunked attention runs on
// the compute queue (how much of the copy hides); and the full pass-2 pattern the
// executor runs (two chunk buffers, loads on the transfer queue, fences).
// Timing: backend synchronize() + a steady clock around each region (hundreds of ms).
//
// Usage: bench_stream_ops [--device cuda] [--S 111274] [--Mq 17543] [--chunk 4096]
//                         [--kv-tile 1024] [--json out.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/dtype.h"

namespace {

using namespace ls;

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "bench_stream_ops: %s\n", m.c_str());
  std::exit(2);
}
#define CHECK_OK(expr)                                      \
  do {                                                      \
    const Status s_ = (expr);                               \
    if (!s_.ok()) die(std::string(#expr) + ": " + s_.message()); \
  } while (0)

template <typename T>
T take(Expected<T> e, const char* what) {
  if (!e.ok()) die(std::string(what) + ": " + e.error().message);
  return std::move(e.value());
}

double time_s(Backend& be, const std::function<void()>& f, int iters) {
  CHECK_OK(be.synchronize());
  f();  // warm-up
  CHECK_OK(be.synchronize());
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    CHECK_OK(be.synchronize());
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cuda", json;
  int64_t S = 111274, Mq = 17543, chunk = 4096, kv_tile = 1024;
  const int64_t H = 56, Dh = 128, I = H * Dh;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--device") device = v;
    else if (k == "--S") S = std::stoll(v);
    else if (k == "--Mq") Mq = std::stoll(v);
    else if (k == "--chunk") chunk = std::stoll(v);
    else if (k == "--kv-tile") kv_tile = std::stoll(v);
    else if (k == "--json") json = v;
    else die("unknown option " + k);
  }
  // Numerics from the developer variables (LAYERSTREAM_ATTENTION, ...), read here: the
  // backend takes them as parameters.
  Numerics numerics;
  Diagnostics diagnostics;
  std::vector<std::string> from_env;
  if (Status s = apply_developer_variables([](const char* n) -> const char* { return std::getenv(n); }, &numerics,
                                           &diagnostics, &from_env);
      !s.ok())
    die(s.message());
  auto be = take(make_backend(device, numerics, diagnostics), "backend");
  std::fprintf(stderr, "bench_stream_ops: numerics %s\n", describe(be->numerics()).c_str());
  const size_t kv_bytes = static_cast<size_t>(S * I * 2);
  const size_t need = 2 * Arena::aligned_bytes(kv_bytes) + 2 * Arena::aligned_bytes(static_cast<size_t>(Mq * I * 2)) +
                      Arena::aligned_bytes(static_cast<size_t>(Mq * H * (Dh + kAttentionStateExtra) * 4)) +
                      4 * Arena::aligned_bytes(static_cast<size_t>(chunk * I * 2)) + (1 << 20);
  auto arena = take(Arena::create(be->memory(), need), "device arena");
  auto host = take(Arena::create(be->pinned_host_memory(), 2 * Arena::aligned_bytes(kv_bytes)), "pinned host");
  auto k = take(arena->alloc(DType::bf16, {S, H, Dh}, "K"), "K");
  auto v = take(arena->alloc(DType::bf16, {S, H, Dh}, "V"), "V");
  auto q = take(arena->alloc(DType::bf16, {Mq, H, Dh}, "Q"), "Q");
  auto o = take(arena->alloc(DType::bf16, {Mq, H, Dh}, "O"), "O");
  auto st = take(arena->alloc(DType::f32, {Mq, H, Dh + kAttentionStateExtra}, "state"), "state");
  TensorView kc[2], vc[2];
  for (int j = 0; j < 2; ++j) {
    kc[j] = take(arena->alloc(DType::bf16, {chunk, H, Dh}, "K chunk"), "K chunk");
    vc[j] = take(arena->alloc(DType::bf16, {chunk, H, Dh}, "V chunk"), "V chunk");
  }
  auto kh = take(host->alloc(DType::bf16, {S, H, Dh}, "host K"), "host K");
  auto vh = take(host->alloc(DType::bf16, {S, H, Dh}, "host V"), "host V");
  {  // random bf16 data, uploaded
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto* hk = static_cast<uint16_t*>(kh.data);
    auto* hv = static_cast<uint16_t*>(vh.data);
    for (int64_t i = 0; i < S * I; ++i) hk[i] = f32_to_bf16(nd(rng)), hv[i] = f32_to_bf16(nd(rng));
    CHECK_OK(be->copy(k, kh));
    CHECK_OK(be->copy(v, vh));
    CHECK_OK(be->copy(q, kh.slice_rows(0, Mq)));
  }
  const double flops = 4.0 * static_cast<double>(Mq) * static_cast<double>(S) * static_cast<double>(I);
  const int64_t n_chunks = (S + chunk - 1) / chunk;
  AttentionParams whole;
  whole.kv_tile = kv_tile;
  auto chunked = [&](const TensorView* kbuf, const TensorView* vbuf, bool streamed) {
    AttentionParams p;
    p.kv_tile = kv_tile;
    p.state = st;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t a = c * chunk, b = std::min(S, a + chunk);
      const int j = static_cast<int>(c % 2);
      p.state_in = c > 0;
      p.finalize = c == n_chunks - 1;
      if (streamed) CHECK_OK(be->wait(Queue::compute, 8 + j));
      const TensorView kk = streamed ? kbuf[j].slice_rows(0, b - a) : k.slice_rows(a, b);
      const TensorView vv = streamed ? vbuf[j].slice_rows(0, b - a) : v.slice_rows(a, b);
      CHECK_OK(be->attention(q, kk, vv, o, p));
      if (streamed) {
        CHECK_OK(be->signal(Queue::compute, 10 + j));
        if (c + 2 < n_chunks) {
          const int64_t a2 = (c + 2) * chunk, b2 = std::min(S, a2 + chunk);
          CHECK_OK(be->wait(Queue::transfer, 10 + j));
          CHECK_OK(be->copy_async(kbuf[j].slice_rows(0, b2 - a2), kh.slice_rows(a2, b2), Queue::transfer));
          CHECK_OK(be->copy_async(vbuf[j].slice_rows(0, b2 - a2), vh.slice_rows(a2, b2), Queue::transfer));
          CHECK_OK(be->signal(Queue::transfer, 8 + j));
        }
      }
    }
  };
  auto prime = [&]() {  // the first two loads of the streamed pattern
    for (int64_t c = 0; c < std::min<int64_t>(2, n_chunks); ++c) {
      const int64_t a = c * chunk, b = std::min(S, a + chunk);
      const int j = static_cast<int>(c % 2);
      CHECK_OK(be->copy_async(kc[j].slice_rows(0, b - a), kh.slice_rows(a, b), Queue::transfer));
      CHECK_OK(be->copy_async(vc[j].slice_rows(0, b - a), vh.slice_rows(a, b), Queue::transfer));
      CHECK_OK(be->signal(Queue::transfer, 8 + j));
    }
  };
  const double t_whole = time_s(*be, [&] { CHECK_OK(be->attention(q, k, v, o, whole)); }, 3);
  const double t_chunked = time_s(*be, [&] { chunked(nullptr, nullptr, false); }, 3);
  const double t_h2d = time_s(*be, [&] {
    CHECK_OK(be->copy_async(k, kh, Queue::transfer));
    CHECK_OK(be->copy_async(v, vh, Queue::transfer));
  }, 3);
  const double t_d2h = time_s(*be, [&] {
    CHECK_OK(be->copy_async(kh, k, Queue::transfer));
    CHECK_OK(be->copy_async(vh, v, Queue::transfer));
  }, 3);
  const double t_streamed = time_s(*be, [&] {
    prime();
    chunked(kc, vc, true);
  }, 3);
  // First use of freshly allocated pinned memory: a device -> host copy into it, then
  // the same copy again; and into a fresh buffer the host touched first (memset).
  auto first_use = [&](bool touch) {
    auto fresh = take(Arena::create(be->pinned_host_memory(), Arena::aligned_bytes(kv_bytes)), "fresh pinned");
    auto dst = take(fresh->alloc(DType::bf16, {S, H, Dh}, "fresh"), "fresh");
    if (touch) std::memset(dst.data, 0, kv_bytes);
    double t[2];
    for (double& ti : t) {
      CHECK_OK(be->synchronize());
      const auto t0 = std::chrono::steady_clock::now();
      CHECK_OK(be->copy_async(dst, k, Queue::transfer));
      CHECK_OK(be->synchronize());
      ti = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    std::printf("D2H into fresh pinned%s: first %.1f ms, second %.1f ms (%.1f / %.1f GB/s)\n",
                touch ? " (host-touched)" : "", t[0] * 1e3, t[1] * 1e3, kv_bytes / t[0] / 1e9, kv_bytes / t[1] / 1e9);
  };
  first_use(false);
  first_use(true);
  const double gbs = 2.0 * static_cast<double>(kv_bytes) / 1e9;
  std::printf("S %lld, Mq %lld, chunk %lld, kv_tile %lld, H %lld, Dh %lld on %s\n", static_cast<long long>(S),
              static_cast<long long>(Mq), static_cast<long long>(chunk), static_cast<long long>(kv_tile),
              static_cast<long long>(H), static_cast<long long>(Dh), be->name().c_str());
  std::printf("attention one call          %8.1f ms  %6.1f TFLOP/s\n", t_whole * 1e3, flops / t_whole / 1e12);
  std::printf("attention chunked (state)   %8.1f ms  %6.1f TFLOP/s  (x%.3f)\n", t_chunked * 1e3,
              flops / t_chunked / 1e12, t_chunked / t_whole);
  std::printf("K+V host->device (pinned)   %8.1f ms  %6.1f GB/s\n", t_h2d * 1e3, gbs / t_h2d);
  std::printf("K+V device->host (pinned)   %8.1f ms  %6.1f GB/s\n", t_d2h * 1e3, gbs / t_d2h);
  std::printf("pass 2 streamed (2 buffers) %8.1f ms  (x%.3f of one call; copies alone %.1f ms)\n", t_streamed * 1e3,
              t_streamed / t_whole, t_h2d * 1e3);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (!f) die("cannot write " + json);
    std::fprintf(f,
                 "{\"S\": %lld, \"Mq\": %lld, \"chunk\": %lld, \"kv_tile\": %lld, \"device\": \"%s\", "
                 "\"attention_ms\": %.3f, \"attention_tflops\": %.2f, \"chunked_ms\": %.3f, \"chunked_tflops\": %.2f, "
                 "\"h2d_gb_per_s\": %.2f, \"d2h_gb_per_s\": %.2f, \"streamed_ms\": %.3f, \"numerics\": \"%s\"}\n",
                 static_cast<long long>(S), static_cast<long long>(Mq), static_cast<long long>(chunk),
                 static_cast<long long>(kv_tile), be->name().c_str(), t_whole * 1e3, flops / t_whole / 1e12,
                 t_chunked * 1e3, flops / t_chunked / 1e12, gbs / t_h2d, gbs / t_d2h, t_streamed * 1e3,
                 describe(be->numerics()).c_str());
    std::fclose(f);
  }
  return 0;
}
