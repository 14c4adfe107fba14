// Fidelity of attention int8 (issue 26 item 3): the relative L2 error of OUR INT8 attention
// (the CPU reference, kv_tile 128) against float64 softmax attention of the same bf16
// inputs, beside Comfy Kitchen's INT8 algorithm and plain SageAttention restated in
// PyTorch (tests/reference/int8_attention_ref.py), read from the golden file
// tests/data/golden/attention_int8_v1.safetensors (written by
// `python3 tests/reference/h3_reference.py --out tests/data/golden --attention-only --device cpu`).
// The issue's targets, per case: err(ours) <= 1.25 err(Kitchen) and err(ours) <= err(Sage).
//
// Cases (docs/numerics.md §9a prints the table):
//  * random inputs with H3-like outliers (large one-signed offsets on a few channels of K,
//    and of Q): made here from integer hashes exactly as the generator makes them (the file
//    holds their FNV-1a 64 hashes, checked, and Kitchen's outputs and both errors);
//  * the golden H3 cases: the attention inputs (after q/k norm and RoPE) of the reference
//    forward for the golden configurations (tiny config: 3 heads x 32; the text refiner
//    and the joint video + audio + text blocks), stored in the file with the float64
//    result and Kitchen's and Sage's outputs.
//
// The second test checks the PyTorch restatement twice on the random head-dim-128 cases:
// kitchen_steps (below) states its docstring's steps again in scalar C++ and must give its
// outputs (measured: the same bf16 bytes in every case); and the C++ restatement of Kitchen
// written in session 9 (below, from a first reading of Kitchen's sources) is run beside it.
// The session-9 one departs from Kitchen's code in the softmax (P against the running
// maximum instead of each key tile's own maximum; the row sum of the unquantised p in every
// tile, where Kitchen sums the quantised p8 in all tiles but the last), in the K scale
// groups (16 keys; Kitchen: 32 keys at cta_k 128, i.e. head dim >= 128 and more than 1024
// keys) and in the rotation (our sign vector instead of Kitchen's four words; Kitchen uses
// H4 only up to 256 keys). Its session-9 rule:
//   rotation   the same signed Walsh-Hadamard transform, normalised (x / sqrt(128))
//   Q          one scale per group of 4 rows (rows r, r+8, r+16, r+24 of each 32-row block)
//   K          Kitchen's anchor (9 samples), then one scale per 16 keys
//   V          one scale per channel over all keys (amax / 127)
//   softmax    fp32 online softmax over 64-key blocks, exp in fp32, P -> u8 rint(p * 255),
//              l the fp32 sum of the unquantised p
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/int8_attention_math.h"
#include "core/dtype.h"
#include "core/hash.h"
#include "io/safetensors.h"
#include "reference/golden_compare.h"

namespace ls {
namespace {

constexpr int kD = 128;  // the C++ restatement's head dim

struct Data {
  int64_t Mq = 0, Mk = 0, H = 0, D = 0;
  std::vector<float> q, k, v;  // bf16-exact values, [M, H, D]
};

// ---- the generator's inputs (int8_attention_ref.py: hash32, uniform24, fidelity_tensor) ----
uint32_t hash32(uint32_t x) {  // lowbias32
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}
double uniform24(uint32_t seed_hash, uint32_t i) { return static_cast<double>(hash32(i ^ seed_hash) >> 8) * 0x1p-24; }

std::vector<float> fidelity_tensor(uint32_t seed, int64_t M, int64_t H, int64_t D, float offset, int channels) {
  const int64_t n = M * H * D;
  const uint32_t sh = hash32(seed), so = hash32(seed ^ 0x5bd1e995u);
  std::vector<bool> outlier(static_cast<size_t>(D), false);
  for (int i = 0; i < channels; ++i) outlier[static_cast<size_t>((37 * i + 5) % D)] = true;
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) {
    double s = 0;
    for (int r = 0; r < 12; ++r) s += uniform24(sh, static_cast<uint32_t>(e * 12 + r));
    float f = static_cast<float>(s - 6.0);
    const int64_t c = e % D, h = (e / D) % H;
    if (channels > 0 && outlier[static_cast<size_t>(c)]) {
      const float u = static_cast<float>(uniform24(so, static_cast<uint32_t>(h * D + c)));
      f = f + offset * (0.5f + u);
    }
    x[static_cast<size_t>(e)] = round_bf16(f);
  }
  return x;
}

std::string fnv_hex(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a64(b.data(), b.size() * 2)));
  return buf;
}

float at(const std::vector<float>& x, int64_t H, int64_t D, int64_t r, int64_t h, int64_t c) {
  return x[static_cast<size_t>((r * H + h) * D + c)];
}
float at(const std::vector<float>& x, int64_t H, int64_t r, int64_t h, int c) { return at(x, H, kD, r, h, c); }

// float64 softmax attention of the (bf16) inputs, [Mq, H, D].
std::vector<double> exact(const Data& d) {
  std::vector<double> out(static_cast<size_t>(d.Mq * d.H * d.D));
  const double sc = 1.0 / std::sqrt(static_cast<double>(d.D));
  std::vector<double> s(static_cast<size_t>(d.Mk));
  for (int64_t h = 0; h < d.H; ++h)
    for (int64_t i = 0; i < d.Mq; ++i) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < d.Mk; ++j) {
        double t = 0;
        for (int64_t c = 0; c < d.D; ++c)
          t += static_cast<double>(at(d.q, d.H, d.D, i, h, c)) * at(d.k, d.H, d.D, j, h, c);
        s[static_cast<size_t>(j)] = t * sc;
        mx = std::max(mx, t * sc);
      }
      double l = 0;
      for (double& e : s) l += (e = std::exp(e - mx));
      for (int64_t c = 0; c < d.D; ++c) {
        double o = 0;
        for (int64_t j = 0; j < d.Mk; ++j) o += s[static_cast<size_t>(j)] * at(d.v, d.H, d.D, j, h, c);
        out[static_cast<size_t>((i * d.H + h) * d.D + c)] = o / l;
      }
    }
  return out;
}

template <typename T>
double rel_l2(const std::vector<T>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    num += e * e, den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
  return b;
}

// Ours (the CPU int8 reference, its default kv_tile 128) or, int8 = false, the bf16 CPU
// reference (attention native, kv_tile 1024): LayerStream's bf16 attention.
std::vector<float> ours(const Data& d, bool int8 = true) {
  std::unique_ptr<Backend> be = make_cpu_backend();
  Numerics n;
  n.attention = int8 ? AttentionAlgorithm::int8 : AttentionAlgorithm::native;
  EXPECT_TRUE(be->set_numerics(n, {}).ok());
  std::vector<uint16_t> q = to_bf16(d.q), k = to_bf16(d.k), v = to_bf16(d.v), o(d.q.size());
  const TensorView qv(q.data(), DType::bf16, {d.Mq, d.H, d.D}), kv(k.data(), DType::bf16, {d.Mk, d.H, d.D}),
      vv(v.data(), DType::bf16, {d.Mk, d.H, d.D}), ov(o.data(), DType::bf16, {d.Mq, d.H, d.D});
  AttentionParams p;
  p.kv_tile = be->default_kv_tile();
  if (int8) {
    EXPECT_EQ(p.kv_tile, kInt8DefaultKvTile);
    std::vector<uint8_t> scratch(static_cast<size_t>(int8_all_scratch_bytes(d.Mk, d.H, d.D) + 256));
    void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 255) / 256 * 256);
    const TensorView sv(base, DType::u8, {int8_all_scratch_bytes(d.Mk, d.H, d.D)});
    EXPECT_TRUE(attention_int8_all(*be, qv, kv, vv, ov, p, sv).ok());
  } else {
    EXPECT_TRUE(be->attention(qv, kv, vv, ov, p).ok());
  }
  std::vector<float> out(o.size());
  for (size_t i = 0; i < o.size(); ++i) out[i] = bf16_to_f32(o[i]);
  return out;
}

// ---- the golden file ----
struct FileCase {
  nlohmann::json meta;
  Data data;
  std::vector<float> kitchen, sage;  // [Mq, H, D] (sage: golden cases only)
  std::vector<double> exact_file;    // golden cases only
};

std::vector<float> floats(const SafetensorsReader& r, const std::string& name) {
  const SafetensorsEntry* e = r.find(name);
  LS_CHECK_MSG(e != nullptr, "attention_int8_v1.safetensors lacks " + name);
  std::vector<double> d = golden::to_f64(r.view(*e));
  return std::vector<float>(d.begin(), d.end());
}

std::vector<FileCase> load_cases(std::string* why) {
  auto gr = SafetensorsReader::open(golden::golden_path("attention_int8_v1.safetensors"));
  if (!gr.ok()) {
    *why = gr.error().message +
           "; python3 tests/reference/h3_reference.py --out tests/data/golden --attention-only --device cpu";
    return {};
  }
  const SafetensorsReader& g = **gr;
  if (std::string f = golden::check_format(g); !f.empty()) {
    *why = f;
    return {};
  }
  std::printf("attention_int8_v1: torch %s on %s (%s)\n", golden::meta(g, "torch").c_str(),
              golden::meta(g, "device").c_str(), golden::meta(g, "kitchen_restatement").c_str());
  std::vector<FileCase> out;
  for (const nlohmann::json& m : nlohmann::json::parse(golden::meta(g, "cases"))) {
    FileCase c;
    c.meta = m;
    const std::string name = m["case"];
    Data& d = c.data;
    d.Mq = m["Mq"], d.Mk = m["Mk"], d.H = m["heads"], d.D = m["head_dim"];
    if (m["kind"] == "random") {
      const uint32_t seed = m["seed"];
      d.q = fidelity_tensor(seed, d.Mq, d.H, d.D, m["q_offset"].get<float>(), m["q_channels"]);
      d.k = fidelity_tensor(seed + 1, d.Mk, d.H, d.D, m["k_offset"].get<float>(), m["k_channels"]);
      d.v = fidelity_tensor(seed + 2, d.Mk, d.H, d.D, 0.0f, 0);
      EXPECT_EQ(fnv_hex(d.q), m["fnv_q"].get<std::string>()) << name << ": q is not the generator's";
      EXPECT_EQ(fnv_hex(d.k), m["fnv_k"].get<std::string>()) << name << ": k is not the generator's";
      EXPECT_EQ(fnv_hex(d.v), m["fnv_v"].get<std::string>()) << name << ": v is not the generator's";
    } else {
      d.q = floats(g, name + ".q");
      d.k = floats(g, name + ".k");
      d.v = floats(g, name + ".v");
      c.sage = floats(g, name + ".sage");
      const std::vector<float> e = floats(g, name + ".exact");
      c.exact_file.assign(e.begin(), e.end());
    }
    c.kitchen = floats(g, name + ".kitchen");
    EXPECT_EQ(c.kitchen.size(), d.q.size()) << name;
    out.push_back(std::move(c));
  }
  return out;
}

// The C++ restatement of session 9 (see the file comment), kept for the cross-check.
void rotate_normalised(float* x) {
  i8a::rotate(x, kD);
  for (int c = 0; c < kD; ++c) x[c] *= 0.0883883476483184f;  // 1 / sqrt(128)
}
int q8of(float x, float s) { return static_cast<int>(std::clamp(std::nearbyint(x / s), -127.0f, 127.0f)); }

std::vector<float> cpp_kitchen(const Data& d, bool l_p8 = false, bool no_center = false) {
  LS_CHECK(d.D == kD);
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


// A second statement of Kitchen's algorithm, scalar C++ written from the docstring of
// tests/reference/int8_attention_ref.py (steps 1-7, head dim 128, no padding): it checks
// that the PyTorch restatement computes what the docstring says (a slip in a reshape or a
// group mapping would show as a large distance). Its fmaf is the C library's (one
// rounding; PyTorch's: float64 then fp32) and exp2f glibc's, so a few outputs may differ
// by a bf16 ulp.
std::vector<float> kitchen_steps(const Data& d) {
  LS_CHECK(d.D == kD);
  const int64_t Mq = d.Mq, Mk = d.Mk, H = d.H;
  const uint32_t words[4] = {0x1035997bu, 0x8087f5eeu, 0xee2e4e1au, 0x71132418u};
  const int cta = Mk > 1024 ? 128 : 64;
  auto rot = [&](float* x) {
    if (Mk > 256)
      for (int c = 0; c < kD; ++c)
        if (((words[c / 32] >> (c % 32)) & 1u) == 0) x[c] = -x[c];
    auto stage = [&](int s) {
      for (int i = 0; i < kD; ++i)
        if ((i & s) == 0) {
          const float a = x[i], b = x[i + s];
          x[i] = a + b, x[i + s] = a - b;
        }
    };
    stage(1), stage(2);
    for (int c = 0; c < kD; ++c) x[c] *= 0.5f;
    if (Mk <= 256) return;
    for (int s = 4; s < kD; s *= 2) stage(s);
    for (int c = 0; c < kD; ++c) x[c] *= 0.1767766952966369f;
  };
  auto row_scale = [](float amax) { return amax / 127.0f + 1e-7f; };
  auto q8of = [](float x, float inv) { return static_cast<int>(std::clamp(std::nearbyint(x * inv), -128.0f, 127.0f)); };
  const float base = static_cast<float>(1.0 / std::sqrt(128.0)) * 1.44269504088896340736f;
  const float off = 7.9943534f;
  std::vector<float> out(d.q.size());
  for (int64_t h = 0; h < H; ++h) {
    // anchor (step 3, float64 sums as the PyTorch restatement)
    int64_t rows[9];
    for (int s = 0; s < 9; ++s) rows[s] = s * (Mk - 1) / 8;
    double e0 = 0, m0 = 0, dist[9] = {};
    for (int c = 0; c < kD; ++c) {
      double sum = 0;
      for (int64_t r : rows) {
        const double x = at(d.k, H, r, h, c);
        e0 += x * x, m0 = std::max(m0, std::fabs(x)), sum += x;
      }
      for (int s = 0; s < 9; ++s) dist[s] += (9.0 * at(d.k, H, rows[s], h, c) - sum) * (9.0 * at(d.k, H, rows[s], h, c) - sum);
    }
    const int best = static_cast<int>(std::min_element(dist, dist + 9) - dist);
    double e1 = 0, m1 = 0;
    for (int c = 0; c < kD; ++c)
      for (int64_t r : rows) {
        const double x = static_cast<double>(at(d.k, H, r, h, c)) - at(d.k, H, rows[best], h, c);
        e1 += x * x, m1 = std::max(m1, std::fabs(x));
      }
    const bool center = e1 < e0 && static_cast<float>(m1) <= static_cast<float>(m0) * 1.125f;
    // K (steps 2, 4)
    std::vector<float> kr(static_cast<size_t>(Mk * kD));
    for (int64_t j = 0; j < Mk; ++j) {
      float* x = &kr[static_cast<size_t>(j * kD)];
      for (int c = 0; c < kD; ++c) x[c] = at(d.k, H, j, h, c) - (center ? at(d.k, H, rows[best], h, c) : 0.0f);
      rot(x);
    }
    const int64_t kgroups = (Mk + cta - 1) / cta * 4;
    std::vector<float> kg(static_cast<size_t>(kgroups), 0.0f), sk(static_cast<size_t>(Mk));
    auto kgroup = [&](int64_t j) { return (j / cta) * 4 + (j % 8) / 2; };
    for (int64_t j = 0; j < Mk; ++j)
      for (int c = 0; c < kD; ++c)
        kg[static_cast<size_t>(kgroup(j))] = std::max(kg[static_cast<size_t>(kgroup(j))], std::fabs(kr[static_cast<size_t>(j * kD + c)]));
    std::vector<int> k8(static_cast<size_t>(Mk * kD));
    for (int64_t j = 0; j < Mk; ++j) {
      sk[static_cast<size_t>(j)] = row_scale(kg[static_cast<size_t>(kgroup(j))]);
      const float inv = 1.0f / sk[static_cast<size_t>(j)];
      for (int c = 0; c < kD; ++c) k8[static_cast<size_t>(j * kD + c)] = q8of(kr[static_cast<size_t>(j * kD + c)], inv);
    }
    // Q (steps 2, 4)
    std::vector<float> qr(static_cast<size_t>(Mq * kD));
    for (int64_t i = 0; i < Mq; ++i) {
      for (int c = 0; c < kD; ++c) qr[static_cast<size_t>(i * kD + c)] = at(d.q, H, i, h, c);
      rot(&qr[static_cast<size_t>(i * kD)]);
    }
    auto qgroup = [](int64_t i) { return (i / 32) * 8 + i % 8; };
    std::vector<float> qg(static_cast<size_t>((Mq + 31) / 32 * 8), 0.0f);
    for (int64_t i = 0; i < Mq; ++i)
      for (int c = 0; c < kD; ++c)
        qg[static_cast<size_t>(qgroup(i))] = std::max(qg[static_cast<size_t>(qgroup(i))], std::fabs(qr[static_cast<size_t>(i * kD + c)]));
    // V (step 5)
    float sv[kD];
    std::vector<int> v8(static_cast<size_t>(Mk * kD));
    for (int c = 0; c < kD; ++c) {
      float mx = 0;
      for (int64_t j = 0; j < Mk; ++j) mx = std::max(mx, std::fabs(at(d.v, H, j, h, c)));
      sv[c] = std::max(mx * (1.0f / 127.0f), 1e-12f);
      const float inv = 1.0f / sv[c];
      for (int64_t j = 0; j < Mk; ++j) v8[static_cast<size_t>(j * kD + c)] = q8of(at(d.v, H, j, h, c), inv);
    }
    // Softmax and P.V (steps 6, 7)
    const int64_t ntile = (Mk + cta - 1) / cta;
    for (int64_t i = 0; i < Mq; ++i) {
      const float sq = row_scale(qg[static_cast<size_t>(qgroup(i))]), inv = 1.0f / sq;
      int q8[kD];
      for (int c = 0; c < kD; ++c) q8[c] = q8of(qr[static_cast<size_t>(i * kD + c)], inv);
      float m = -50000.0f, dt[4] = {1, 1, 1, 1}, acc[kD] = {};
      std::vector<float> st(static_cast<size_t>(cta)), sc(static_cast<size_t>(cta)), p(static_cast<size_t>(cta));
      for (int64_t t = 0; t < ntile; ++t) {
        const int64_t j0 = t * cta, n = std::min<int64_t>(cta, Mk - j0);
        const bool last = t == ntile - 1;
        float tile_m = -INFINITY;
        for (int64_t jj = 0; jj < n; ++jj) {
          int dot = 0;
          for (int c = 0; c < kD; ++c) dot += q8[c] * k8[static_cast<size_t>((j0 + jj) * kD + c)];
          st[static_cast<size_t>(jj)] = static_cast<float>(dot);
          sc[static_cast<size_t>(jj)] = base * (sq * sk[static_cast<size_t>(j0 + jj)]);
          tile_m = std::max(tile_m, std::fmaf(st[static_cast<size_t>(jj)], sc[static_cast<size_t>(jj)], -off));
        }
        const float x = std::exp2f(-std::fabs(m - tile_m));
        const float o_scale = m < tile_m ? x : 1.0f, ts = tile_m < m ? x : 1.0f;
        for (float& e : dt) e *= o_scale;
        for (float& a : acc) a *= o_scale;
        for (int64_t jj = 0; jj < cta; ++jj)
          p[static_cast<size_t>(jj)] =
              jj < n ? std::exp2f(std::fmaf(st[static_cast<size_t>(jj)], sc[static_cast<size_t>(jj)], -tile_m)) : 0.0f;
        std::vector<int> p8(static_cast<size_t>(cta));
        for (int64_t jj = 0; jj < cta; ++jj)
          p8[static_cast<size_t>(jj)] = static_cast<int>(std::clamp(std::nearbyint(p[static_cast<size_t>(jj)]), 0.0f, 255.0f));
        for (int c = 0; c < kD; ++c) {
          int part = 0;
          for (int64_t jj = 0; jj < n; ++jj) part += p8[static_cast<size_t>(jj)] * v8[static_cast<size_t>((j0 + jj) * kD + c)];
          acc[c] = std::fmaf(static_cast<float>(part), ts, acc[c]);
        }
        for (int f = 0; f < cta / 16; ++f)
          for (int th = 0; th < 4; ++th) {
            const size_t a = static_cast<size_t>(f * 16 + 2 * th);
            const float den = last ? (p[a] + p[a + 1]) + (p[a + 8] + p[a + 9])
                                   : static_cast<float>(p8[a] + p8[a + 1] + p8[a + 8] + p8[a + 9]);
            dt[th] = std::fmaf(den, ts, dt[th]);
          }
        m = std::max(m, tile_m);
      }
      const float rl = 1.0f / ((dt[0] + dt[1]) + (dt[2] + dt[3]));
      for (int c = 0; c < kD; ++c) out[static_cast<size_t>((i * H + h) * kD + c)] = round_bf16((acc[c] * rl) * sv[c]);
    }
  }
  return out;
}

TEST(Int8Fidelity, OursWithinIssueTargetsAgainstKitchenAndSage) {
  std::string why;
  const std::vector<FileCase> cases = load_cases(&why);
  ASSERT_FALSE(cases.empty()) << why;
  std::printf("\n| case | Mq x Mk x heads x head dim | ours (int8) | Kitchen | SageAttention | bf16 (native) | ours / Kitchen |\n"
              "|---|---|---|---|---|---|---|\n");
  double worst = 0;
  for (const FileCase& c : cases) {
    const std::string name = c.meta["case"];
    const Data& d = c.data;
    const std::vector<double> want = exact(d);
    if (!c.exact_file.empty()) {  // the file's float64 result (stored f32) is this one
      EXPECT_LT(rel_l2(c.exact_file, want), 1e-6) << name;
    }
    const double eo = rel_l2(ours(d), want), eb = rel_l2(ours(d, false), want);
    const double ek = rel_l2(c.kitchen, want), es = c.meta["err_sage"];
    // The generator's errors were measured against its own float64: the same to ~1e-9.
    EXPECT_NEAR(ek, c.meta["err_kitchen"].get<double>(), 1e-6 * ek) << name;
    if (!c.sage.empty()) {
      EXPECT_NEAR(rel_l2(c.sage, want), es, 1e-6 * es) << name;
    }
    std::printf("| %s | %lld x %lld x %lld x %lld | %.3e | %.3e | %.3e | %.3e | %.2f |\n", name.c_str(),
                static_cast<long long>(d.Mq), static_cast<long long>(d.Mk), static_cast<long long>(d.H),
                static_cast<long long>(d.D), eo, ek, es, eb, eo / ek);
    worst = std::max(worst, eo / ek);
    EXPECT_GT(eo, 2 * eb) << name << ": int8 is as exact as bf16 (the test can fail)";
    EXPECT_LE(eo, 1.25 * ek) << name << ": ours vs Kitchen's restated algorithm (issue 26: at most 1.25x)";
    EXPECT_LE(eo, es) << name << ": ours vs SageAttention's restated algorithm (issue 26: at most 1x)";
  }
  std::printf("largest ours / Kitchen: %.2f\n", worst);
}

// The session-9 C++ restatement of Kitchen against the PyTorch one on the same inputs
// (the random head-dim-128 cases). The session-9 one is not the same algorithm (file
// comment): this prints how far apart they are and each one's error, and holds the PyTorch
// restatement's error within a factor 1.5 of it either way (a gross misreading in either
// would break it). kitchen_steps must be within 5 % of Kitchen's error of the PyTorch
// output (it equals it byte for byte today).
TEST(Int8Fidelity, CppKitchenRestatementAgainstPyTorchKitchen) {
  std::string why;
  const std::vector<FileCase> cases = load_cases(&why);
  ASSERT_FALSE(cases.empty()) << why;
  std::printf("\n| case | Kitchen (PyTorch) | C++ restatement | C++, l = sum p8 | C++, no anchor | C++ vs PyTorch (rel L2) "
              "| steps in C++ vs PyTorch: rel L2, bf16 values differing |\n|---|---|---|---|---|---|---|\n");
  int n = 0;
  for (const FileCase& c : cases) {
    if (c.meta["kind"] != "random" || c.data.D != kD) continue;
    ++n;
    const std::vector<double> want = exact(c.data);
    const std::vector<float> cpp = cpp_kitchen(c.data);
    std::vector<double> py(c.kitchen.begin(), c.kitchen.end());
    const double ep = rel_l2(c.kitchen, want), ec = rel_l2(cpp, want);
    const std::vector<float> steps = kitchen_steps(c.data);
    size_t differ = 0;
    for (size_t i = 0; i < steps.size(); ++i) differ += steps[i] != c.kitchen[i];
    const double dist = rel_l2(steps, py);
    std::printf("| %s | %.3e | %.3e | %.3e | %.3e | %.3e | %.2e, %zu of %zu |\n", c.meta["case"].get<std::string>().c_str(),
                ep, ec, rel_l2(cpp_kitchen(c.data, true), want), rel_l2(cpp_kitchen(c.data, false, true), want),
                rel_l2(cpp, py), dist, differ, steps.size());
    EXPECT_LT(dist, 0.05 * ep) << c.meta["case"] << ": the PyTorch restatement does not compute its docstring's steps";
    EXPECT_LE(ep, 1.5 * ec) << c.meta["case"];
    EXPECT_LE(ec, 1.5 * ep) << c.meta["case"];
  }
  EXPECT_GT(n, 0);
}

}  // namespace
}  // namespace ls
