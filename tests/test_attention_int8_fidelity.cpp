// Fidelity of attention int8 (issue 26 item 3) against a C++ restatement of Comfy Kitchen's
// INT8 attention (read from Comfy-Org/comfy-kitchen comfy_kitchen/backends/cuda/
// sage_attention/quant_qk_int8.cu and sage_attention.py; restated from that reading, no code
// copied): the relative L2 error of each against float64 softmax attention of the same bf16
// inputs, on random inputs with H3-like outlier channels (large one-signed offsets) in K and
// in Q. The issue asks ours <= 1.25x Kitchen's; this test holds that and prints the table
// (docs/numerics.md §9a). The restatement, per head:
//   rotation   the same signed Walsh-Hadamard transform, normalised (x / sqrt(128))
//   Q          one scale per group of 4 rows (rows r, r+8, r+16, r+24 of each 32-row block:
//              Kitchen's per-thread groups), s = amax / 127 + 1e-7, q8 = clamp(rint(x / s))
//   K          Kitchen's anchor: of 9 evenly spaced sample keys the one minimising the sum of
//              (9 k_cand - sum k_samples)^2, subtracted from every key when that lowers the
//              samples' energy and raises their abs-max by at most 12.5%; then one scale per
//              16 keys (keys 2o, 2o+1, 2o+8, 2o+9, ... of each 64-key block)
//   V          one scale per channel over all keys (amax / 127)
//   softmax    fp32 online softmax over 64-key blocks, exp in fp32, P -> u8 rint(p * 255),
//              l the fp32 sum of the unquantised p (SageAttention's row sum)
// Ours is the CPU reference itself (attention_int8 at kv_tile 128).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/int8_attention_math.h"
#include "core/dtype.h"

namespace ls {
namespace {

constexpr int kD = 128;

struct Case {
  const char* name;
  float k_outlier, q_outlier;  // offsets of the outlier channels
  int k_channels, q_channels;  // how many outlier channels
};

struct Data {
  int64_t Mq, Mk, H;
  std::vector<float> q, k, v;  // bf16-rounded values, [M, H, 128]
};

Data make(const Case& c, int64_t Mq, int64_t Mk, int64_t H, uint32_t seed) {
  Data d{Mq, Mk, H, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  auto fill = [&](std::vector<float>& x, int64_t M, float off, int nch) {
    x.resize(static_cast<size_t>(M * H * kD));
    std::vector<int> chans;
    for (int i = 0; i < nch; ++i) chans.push_back((37 * i + 5) % kD);
    std::vector<float> per(static_cast<size_t>(H * kD), 0.0f);
    for (int64_t h = 0; h < H; ++h)
      for (int ch : chans) per[static_cast<size_t>(h * kD + ch)] = off * scale(rng);
    for (int64_t i = 0; i < M * H * kD; ++i)
      x[static_cast<size_t>(i)] = round_bf16(nd(rng) + per[static_cast<size_t>(i % (H * kD))]);
  };
  fill(d.q, Mq, c.q_outlier, c.q_channels);
  fill(d.k, Mk, c.k_outlier, c.k_channels);
  fill(d.v, Mk, 0.0f, 0);
  return d;
}

float at(const std::vector<float>& x, int64_t H, int64_t r, int64_t h, int c) {
  return x[static_cast<size_t>((r * H + h) * kD + c)];
}

// float64 softmax attention of the (bf16) inputs.
std::vector<double> exact(const Data& d) {
  std::vector<double> out(static_cast<size_t>(d.Mq * d.H * kD));
  const double sc = 1.0 / std::sqrt(static_cast<double>(kD));
  std::vector<double> s(static_cast<size_t>(d.Mk));
  for (int64_t h = 0; h < d.H; ++h)
    for (int64_t i = 0; i < d.Mq; ++i) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < d.Mk; ++j) {
        double t = 0;
        for (int c = 0; c < kD; ++c) t += static_cast<double>(at(d.q, d.H, i, h, c)) * at(d.k, d.H, j, h, c);
        s[static_cast<size_t>(j)] = t * sc;
        mx = std::max(mx, t * sc);
      }
      double l = 0;
      for (double& e : s) l += (e = std::exp(e - mx));
      for (int c = 0; c < kD; ++c) {
        double o = 0;
        for (int64_t j = 0; j < d.Mk; ++j) o += s[static_cast<size_t>(j)] * at(d.v, d.H, j, h, c);
        out[static_cast<size_t>((i * d.H + h) * kD + c)] = o / l;
      }
    }
  return out;
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = got[i] - want[i];
    num += e * e, den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// Ours: the CPU reference.
std::vector<float> ours(const Data& d) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Numerics n;
  n.attention = AttentionAlgorithm::int8;
  EXPECT_TRUE(be->set_numerics(n, {}).ok());
  auto bf = [&](const std::vector<float>& x, int64_t M) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
    (void)M;
    return b;
  };
  std::vector<uint16_t> q = bf(d.q, d.Mq), k = bf(d.k, d.Mk), v = bf(d.v, d.Mk), o(d.q.size());
  const TensorView qv(q.data(), DType::bf16, {d.Mq, d.H, kD}), kv(k.data(), DType::bf16, {d.Mk, d.H, kD}),
      vv(v.data(), DType::bf16, {d.Mk, d.H, kD}), ov(o.data(), DType::bf16, {d.Mq, d.H, kD});
  std::vector<uint8_t> scratch(static_cast<size_t>(int8_all_scratch_bytes(d.Mk, d.H, kD) + 256));
  void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 255) / 256 * 256);
  const TensorView sv(base, DType::u8, {int8_all_scratch_bytes(d.Mk, d.H, kD)});
  AttentionParams p;
  p.kv_tile = kInt8DefaultKvTile;
  EXPECT_TRUE(attention_int8_all(*be, qv, kv, vv, ov, p, sv).ok());
  std::vector<float> out(o.size());
  for (size_t i = 0; i < o.size(); ++i) out[i] = bf16_to_f32(o[i]);
  return out;
}

// The Kitchen restatement (see the file comment).
void rotate_normalised(float* x) {
  i8a::rotate(x, kD);
  for (int c = 0; c < kD; ++c) x[c] *= 0.0883883476483184f;  // 1 / sqrt(128)
}
int q8of(float x, float s) { return static_cast<int>(std::clamp(std::nearbyint(x / s), -127.0f, 127.0f)); }

// l_p8: the denominator as the sum of the quantised p8 / 255 (ours), an ablation.
std::vector<float> kitchen(const Data& d, bool l_p8 = false, bool no_center = false) {
  const int64_t Mq = d.Mq, Mk = d.Mk, H = d.H;
  std::vector<float> out(d.q.size());
  for (int64_t h = 0; h < H; ++h) {
    // K anchor (9 samples).
    std::vector<int64_t> rows(9);
    for (int s = 0; s < 9; ++s) rows[static_cast<size_t>(s)] = s * (Mk - 1) / 8;
    double e0 = 0, m0 = 0;
    std::vector<double> dist(9, 0.0);
    for (int c = 0; c < kD; ++c) {
      double sum = 0;
      for (int64_t r : rows) {
        const double x = at(d.k, H, r, h, c);
        e0 += x * x, m0 = std::max(m0, std::fabs(x)), sum += x;
      }
      for (int s = 0; s < 9; ++s) {
        const double t = 9.0 * at(d.k, H, rows[static_cast<size_t>(s)], h, c) - sum;
        dist[static_cast<size_t>(s)] += t * t;
      }
    }
    const int best = static_cast<int>(std::min_element(dist.begin(), dist.end()) - dist.begin());
    double e1 = 0, m1 = 0;
    for (int c = 0; c < kD; ++c)
      for (int64_t r : rows) {
        const double x = at(d.k, H, r, h, c) - at(d.k, H, rows[static_cast<size_t>(best)], h, c);
        e1 += x * x, m1 = std::max(m1, std::fabs(x));
      }
    const bool center = !no_center && e1 < e0 && m1 <= 1.125 * m0;
    std::vector<float> anchor(kD, 0.0f);
    if (center)
      for (int c = 0; c < kD; ++c) anchor[static_cast<size_t>(c)] = at(d.k, H, rows[static_cast<size_t>(best)], h, c);
    // K rotated, scales per 16 keys.
    std::vector<float> kr(static_cast<size_t>(Mk * kD)), sk(static_cast<size_t>(Mk));
    for (int64_t j = 0; j < Mk; ++j) {
      for (int c = 0; c < kD; ++c) kr[static_cast<size_t>(j * kD + c)] = at(d.k, H, j, h, c) - anchor[static_cast<size_t>(c)];
      rotate_normalised(&kr[static_cast<size_t>(j * kD)]);
    }
    for (int64_t b0 = 0; b0 < Mk; b0 += 64)
      for (int o = 0; o < 4; ++o) {
        std::vector<int64_t> grp;
        for (int jj = 0; jj < 8; ++jj)
          for (int p = 0; p < 2; ++p) {
            const int64_t j = b0 + jj * 8 + o * 2 + p;
            if (j < Mk) grp.push_back(j);
          }
        float mx = 0;
        for (int64_t j : grp)
          for (int c = 0; c < kD; ++c) mx = std::max(mx, std::fabs(kr[static_cast<size_t>(j * kD + c)]));
        for (int64_t j : grp) sk[static_cast<size_t>(j)] = mx / 127.0f + 1e-7f;
      }
    // Q rotated, scales per 4 rows (r, r+8, r+16, r+24 of each 32-row block).
    std::vector<float> qr(static_cast<size_t>(Mq * kD)), sq(static_cast<size_t>(Mq));
    for (int64_t i = 0; i < Mq; ++i) {
      for (int c = 0; c < kD; ++c) qr[static_cast<size_t>(i * kD + c)] = at(d.q, H, i, h, c);
      rotate_normalised(&qr[static_cast<size_t>(i * kD)]);
    }
    for (int64_t b0 = 0; b0 < Mq; b0 += 32)
      for (int r = 0; r < 8; ++r) {
        float mx = 0;
        for (int j = 0; j < 4; ++j) {
          const int64_t i = b0 + r + 8 * j;
          if (i < Mq)
            for (int c = 0; c < kD; ++c) mx = std::max(mx, std::fabs(qr[static_cast<size_t>(i * kD + c)]));
        }
        for (int j = 0; j < 4; ++j)
          if (b0 + r + 8 * j < Mq) sq[static_cast<size_t>(b0 + r + 8 * j)] = mx / 127.0f + 1e-7f;
      }
    // V per channel.
    std::vector<float> svs(kD);
    for (int c = 0; c < kD; ++c) {
      float mx = 0;
      for (int64_t j = 0; j < Mk; ++j) mx = std::max(mx, std::fabs(at(d.v, H, j, h, c)));
      svs[static_cast<size_t>(c)] = std::max(mx / 127.0f, 1e-30f);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
    for (int64_t i = 0; i < Mq; ++i) {
      std::vector<int> q8(kD);
      for (int c = 0; c < kD; ++c) q8[static_cast<size_t>(c)] = q8of(qr[static_cast<size_t>(i * kD + c)], sq[static_cast<size_t>(i)]);
      float m = -INFINITY, l = 0;
      std::vector<float> acc(kD, 0.0f);
      for (int64_t t0 = 0; t0 < Mk; t0 += 64) {
        const int64_t t1 = std::min(Mk, t0 + 64);
        std::vector<float> s(static_cast<size_t>(t1 - t0));
        float mn = m;
        for (int64_t j = t0; j < t1; ++j) {
          int dot = 0;
          for (int c = 0; c < kD; ++c)
            dot += q8[static_cast<size_t>(c)] * q8of(kr[static_cast<size_t>(j * kD + c)], sk[static_cast<size_t>(j)]);
          s[static_cast<size_t>(j - t0)] = static_cast<float>(dot) * sq[static_cast<size_t>(i)] * sk[static_cast<size_t>(j)] * scale;
          mn = std::max(mn, s[static_cast<size_t>(j - t0)]);
        }
        const float alpha = m == -INFINITY ? 0.0f : std::exp(m - mn);
        l *= alpha;
        for (float& a : acc) a *= alpha;
        for (int64_t j = t0; j < t1; ++j) {
          const float p = std::exp(s[static_cast<size_t>(j - t0)] - mn);
          const float p8 = std::nearbyint(p * 255.0f);
          l += l_p8 ? p8 / 255.0f : p;
          for (int c = 0; c < kD; ++c)
            acc[static_cast<size_t>(c)] += p8 * static_cast<float>(q8of(at(d.v, H, j, h, c), svs[static_cast<size_t>(c)]));
        }
        m = mn;
      }
      for (int c = 0; c < kD; ++c)
        out[static_cast<size_t>((i * H + h) * kD + c)] =
            round_bf16(acc[static_cast<size_t>(c)] * svs[static_cast<size_t>(c)] / 255.0f / l);
    }
  }
  return out;
}

TEST(Int8Fidelity, OursAtMostOnePointTwoFiveTimesKitchensRestatement) {
  const Case cases[] = {
      {"plain gaussian", 0.0f, 0.0f, 0, 0},
      {"K: 4 outlier channels +10", 10.0f, 0.0f, 4, 0},
      {"K: 4 outlier channels +20", 20.0f, 0.0f, 4, 0},
      {"K +15 and Q +8, 4 channels each", 15.0f, 8.0f, 4, 4},
      {"K: 16 outlier channels +12", 12.0f, 0.0f, 16, 0},
  };
  std::printf("| inputs (Mq 64, Mk 2048, 2 heads x 128) | ours (int8) | Kitchen restated | ratio |\n|---|---|---|---|\n");
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const Data d = make(c, 64, 2048, 2, seed++);
    const std::vector<double> want = exact(d);
    const double eo = rel_l2(ours(d), want), ek = rel_l2(kitchen(d), want);
    std::printf("| %s | %.3e | %.3e | %.2f |\n", c.name, eo, ek, eo / ek);
    std::printf("|   ablation: Kitchen with l = sum p8 / 255 | | %.3e | |\n|   ablation: Kitchen without its anchor | | %.3e | |\n",
                rel_l2(kitchen(d, true), want), rel_l2(kitchen(d, false, true), want));
    EXPECT_GT(eo, 1e-4) << c.name << ": int8 is not exact (the test can fail)";
    EXPECT_LE(eo, 1.25 * ek) << c.name;
  }
}

}  // namespace
}  // namespace ls
