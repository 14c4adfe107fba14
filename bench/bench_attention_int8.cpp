// INT8 attention on the GPU at H3's width (issue 26): S = 111,274 queries and keys (the
// default; --s N), 56 heads x 128, the portable kernel (attention_int8.cu) or whatever the
// CUDA backend dispatches attention int8 to. Times the key statistics + prepare (once per
// block) and the attention (per block) separately, and reports the attention's rate by the
// bf16 kernel's FLOP count 4 S^2 H Dh (TOP/s "equivalent"). Random inputs (K with two
// outlier channels), each timed call after one warm-up; the median of --reps.
//   bench_attention_int8 [--s N] [--reps R] [--out FILE.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "bench_json.h"
#include "core/arena.h"
#include "core/dtype.h"

using namespace ls;

int main(int argc, char** argv) {
  int64_t S = 111274, reps = 3;
  std::string out = "bench_attention_int8.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--s") S = std::atoll(argv[i + 1]);
    else if (a == "--reps") reps = std::atoll(argv[i + 1]);
    else if (a == "--out") out = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const int64_t H = 56, Dh = 128, I = H * Dh;
  Numerics n;
  n.attention = AttentionAlgorithm::int8;
  auto be = make_backend("cuda", n, {});
  if (!be.ok()) {
    std::fprintf(stderr, "bench_attention_int8: %s\n", be.error().message.c_str());
    return 1;
  }
  Backend& b = **be;
  const int64_t kb = int8_keys_bytes(S, H, Dh);
  auto arena = Arena::create(b.memory(), static_cast<size_t>(4 * S * I * 2 + kb + (64ll << 20)));
  if (!arena.ok()) {
    std::fprintf(stderr, "bench_attention_int8: %s\n", arena.error().message.c_str());
    return 1;
  }
  auto alloc = [&](DType t, std::initializer_list<int64_t> d) {
    auto v = (*arena)->alloc(t, d, "bench");
    LS_CHECK(v.ok());
    return *v;
  };
  const TensorView q = alloc(DType::bf16, {S, H, Dh}), k = alloc(DType::bf16, {S, H, Dh}),
                   v = alloc(DType::bf16, {S, H, Dh}), o = alloc(DType::bf16, {S, H, Dh});
  const TensorView stats = alloc(DType::f32, {3, H, Dh}), kbuf = alloc(DType::u8, {kb});
  const Int8Keys keys = int8_keys_view(kbuf.data, S, H, Dh, kbuf.device);
  {  // random bf16 inputs, one row block at a time through a host buffer
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t rows = 4096;
    std::vector<uint16_t> h(static_cast<size_t>(rows * I));
    for (const TensorView* t : {&q, &k, &v})
      for (int64_t r0 = 0; r0 < S; r0 += rows) {
        const int64_t r1 = std::min(S, r0 + rows);
        for (int64_t i = 0; i < (r1 - r0) * I; ++i) {
          const int64_t c = i % Dh;
          h[static_cast<size_t>(i)] = f32_to_bf16(nd(rng) + (t == &k && (c == 1 || c == 67) ? 12.0f : 0.0f));
        }
        LS_CHECK(b.copy(t->slice_rows(r0, r1), TensorView(h.data(), DType::bf16, {r1 - r0, H, Dh})).ok());
      }
  }
  AttentionParams p;
  p.kv_tile = b.numerics().kv_tile;
  auto time = [&](auto&& fn) {
    LS_CHECK(fn().ok());
    LS_CHECK(b.synchronize().ok());
    std::vector<double> t;
    for (int64_t r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      LS_CHECK(fn().ok());
      LS_CHECK(b.synchronize().ok());
      t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const double t_prep = time([&]() -> Status {
    LS_TRY(b.int8_key_stats(k, v, stats, true));
    return b.int8_prepare(k, v, stats, keys);
  });
  const double t_attn = time([&]() { return b.attention_int8(q, keys, o, p); });
  const double flop = 4.0 * static_cast<double>(S) * static_cast<double>(S) * static_cast<double>(H * Dh);
  const double tops = flop / t_attn / 1e12;
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\n  \"bench\": \"attention_int8\",\n  \"device\": \"%s\",\n  \"numerics\": \"%s\",\n"
                "  \"S\": %lld,\n  \"heads\": %lld,\n  \"head_dim\": %lld,\n  \"reps\": %lld,\n"
                "  \"prepare_seconds\": %.6f,\n  \"attention_seconds\": %.6f,\n"
                "  \"attention_tops_bf16_flop_count\": %.1f,\n  \"flop_count\": \"4 S^2 H Dh\"\n}\n",
                bench::json_escape(b.name()).c_str(), bench::json_escape(describe(b.numerics())).c_str(),
                static_cast<long long>(S), static_cast<long long>(H), static_cast<long long>(Dh),
                static_cast<long long>(reps), t_prep, t_attn, tops);
  std::printf("%s", buf);
  if (!bench::write_json_text(out, buf)) {
    std::fprintf(stderr, "bench_attention_int8: cannot write %s\n", out.c_str());
    return 1;
  }
  return 0;
}
