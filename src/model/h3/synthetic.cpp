// Deterministic synthetic weights (config.h fill_synthetic), what make-model writes.
#include "model/h3/config.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/hash.h"
#include "core/thread_pool.h"

namespace ls::h3 {

// ---- synthetic weights ----------------------------------------------------------------
//
// Value of element i of tensor `name` under `seed`: a counter-based hash, so any piece
// of a tensor can be produced alone:
//   key  = splitmix64(fnv1a64(name) ^ splitmix64(seed))
//   bits = splitmix64(key + (i + 1) * 0x9E3779B97F4A7C15)   (= position i of a splitmix stream)
//   n    = (u0 + u1 + u2 + u3 - 2) * sqrt(3)  with u_k = the four 16-bit chunks / 65536
// n is an Irwin-Hall approximation of N(0, 1) (mean 0, variance 1, |n| <= 2*sqrt(3)). Only
// +, *, / and sqrt are used (all correctly rounded IEEE operations, no libm), so the
// values are the same bits on every machine.
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double approx_normal(uint64_t bits) {
  const double sum = static_cast<double>(bits & 0xffff) + static_cast<double>((bits >> 16) & 0xffff) +
                     static_cast<double>((bits >> 32) & 0xffff) + static_cast<double>(bits >> 48);
  // Each chunk is uniform on {0..65535}; (c + 0.5) / 65536 is uniform on (0, 1).
  return ((sum + 2.0) / 65536.0 - 2.0) * 1.7320508075688772;
}

enum class InitKind { normal, norm_weight, inv_freq, curve_table };
struct Init {
  InitKind kind = InitKind::normal;
  double mean = 0.0;
  double stddev = 0.0;
};

// The scale of each tensor kind, chosen so a forward pass over synthetic weights keeps
// activations in a realistic range through 50 blocks:
//  - input-side linears (qkv, fc1, patch/condition projections, heads): N(0, 1/fan_in),
//    so a unit-RMS input gives a unit-RMS output;
//  - output-side linears (out_proj, fc2): 0.5/sqrt(fan_in), and the AdaLN gates are
//    ~0.1, so each block adds ~0.05 of the residual's scale;
//  - norm weights 1 + N(0, 0.05); biases N(0, 0.02);
//  - AdaLN linears give shift/scale/gate ~ N(0, 0.1): weight std 0.1/sqrt(t) / rms(input),
//    where the input is silu(t_emb) ~ 0.3 RMS (unpruned) or the ~0.5 RMS curve table;
//  - a PDD bank (video_out [n*4C, D] and audio_out [n*Ca, D], ComfyUI's shape) gets the
//    head's scale in every row block; ComfyUI reads block 0 as the full head and later
//    blocks as offsets from it, so the effective head of a synthetic bank is larger than
//    a trained one's; bank files are for plumbing and parity tests. Block 0 of a bank
//    holds the same values as the unbanked head (a value depends on name and index);
//  - rope.inv_freq: the exact fp32 values 10000^(-i/len);
//  - adaln_t_table: a smooth post-SiLU-like curve over the grid per column (below).
Init synthetic_init(const TensorSpec& s) {
  const std::string& n = s.name;
  const int64_t fan_in = s.shape.size() == 2 ? s.shape[1] : 1;
  const double inv_sqrt_fan = 1.0 / std::sqrt(static_cast<double>(fan_in));
  if (n == "rope.inv_freq") return {InitKind::inv_freq, 0, 0};
  if (n == "adaln_t_table") return {InitKind::curve_table, 0, 0};
  if (n.ends_with("norm1.weight") || n.ends_with("norm2.weight") || n.ends_with("_norm.weight") ||
      n.ends_with("final_norm.weight") || n == "final_layer.norm.weight")
    return {InitKind::norm_weight, 1.0, 0.05};
  const bool adaln = n.find("adaln_proj") != std::string::npos;
  if (n.ends_with(".bias")) return {InitKind::normal, 0.0, adaln ? 0.05 : 0.02};
  if (adaln) {
    const bool curve = s.dtype == DType::f32;  // AdaLN linears are fp32 exactly in curve form
    return {InitKind::normal, 0.0, 0.1 * inv_sqrt_fan / (curve ? 0.5 : 0.3)};
  }
  if (n.ends_with("attn.out_proj.weight") || n.ends_with("mlp.fc2.weight"))
    return {InitKind::normal, 0.0, 0.5 * inv_sqrt_fan};
  return {InitKind::normal, 0.0, inv_sqrt_fan};
}

// Column j of the curve table: a cubic z(x) in x = g / (grid - 1) with hashed
// coefficients, passed through silu_like(z) = z * (0.5 + 0.5 * z / sqrt(1 + z^2)) (a
// SiLU look-alike built from exact IEEE operations: -> z for large z, -> 0 for very
// negative z, minimum about -0.2).
float curve_table_value(uint64_t key, int64_t grid, int64_t k, int64_t idx) {
  const int64_t g = idx / k, j = idx % k;
  const uint64_t col = splitmix64(key ^ static_cast<uint64_t>(j));
  const double a = approx_normal(splitmix64(col + 1)), b = approx_normal(splitmix64(col + 2));
  const double c = approx_normal(splitmix64(col + 3)), d = approx_normal(splitmix64(col + 4));
  const double x = static_cast<double>(g) / static_cast<double>(grid - 1);
  const double z = a + x * (b + x * (c + x * d));
  return static_cast<float>(z * (0.5 + 0.5 * z / std::sqrt(1.0 + z * z)));
}

}  // namespace

void fill_synthetic(const TensorSpec& spec, uint64_t seed, int64_t begin, int64_t count, void* out) {
  LS_CHECK(begin >= 0 && count >= 0 && begin + count <= spec.numel());
  LS_CHECK(dtype_is_float(spec.dtype));
  const Init init = synthetic_init(spec);
  const uint64_t key = splitmix64(fnv1a64(spec.name.data(), spec.name.size()) ^ splitmix64(seed));
  const DType dt = spec.dtype;
  const int64_t grain = 1 << 15;
  if (init.kind == InitKind::normal || init.kind == InitKind::norm_weight) {
    // The bulk of every model: typed loops (no per-element dtype dispatch). The value
    // is the same fp32 number either way; bf16 rounds it to nearest even (dtype.h).
    auto value = [&](int64_t idx) {
      const uint64_t bits = splitmix64(key + static_cast<uint64_t>(idx + 1) * 0x9E3779B97F4A7C15ull);
      return static_cast<float>(init.mean + init.stddev * approx_normal(bits));
    };
    parallel_for(count, grain, [&](int64_t a, int64_t b) {
      if (dt == DType::bf16) {
        uint16_t* o = static_cast<uint16_t*>(out);
        for (int64_t i = a; i < b; ++i) o[i] = f32_to_bf16(value(begin + i));
      } else if (dt == DType::f32) {
        float* o = static_cast<float*>(out);
        for (int64_t i = a; i < b; ++i) o[i] = value(begin + i);
      } else {
        for (int64_t i = a; i < b; ++i) store_from_f32(out, dt, i, value(begin + i));
      }
    });
    return;
  }
  parallel_for(count, grain, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const int64_t idx = begin + i;
      float v;
      if (init.kind == InitKind::inv_freq)
        // fp32 10000^(-i/len): computed in double, rounded once to fp32.
        v = static_cast<float>(std::pow(10000.0, -static_cast<double>(idx) / static_cast<double>(spec.shape[0])));
      else
        v = curve_table_value(key, spec.shape[0], spec.shape[1], idx);
      store_from_f32(out, dt, i, v);
    }
  });
}

}  // namespace ls::h3
