// Activation sizes of an H3 forward; see memory_table.h for the arithmetic.
#include "model/h3/memory_table.h"

#include <algorithm>

namespace ls::h3 {

int64_t MemoryItem::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string MemoryItem::shape_str() const {
  std::string r = "[";
  for (size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + "]";
}

int64_t MemoryPhase::bytes() const {
  int64_t n = 0;
  for (const auto& m : live) n += m.bytes();
  return n;
}

int64_t BlockMemory::peak_bytes() const { return peak_phase().bytes(); }

const MemoryPhase& BlockMemory::peak_phase() const {
  LS_CHECK(!phases.empty());
  return *std::max_element(phases.begin(), phases.end(),
                           [](const MemoryPhase& a, const MemoryPhase& b) { return a.bytes() < b.bytes(); });
}

std::vector<MemoryItem> h3_buffer_table(const H3Config& c, int64_t S, int64_t video_tokens) {
  LS_CHECK(S >= 0 && video_tokens >= 0 && video_tokens <= S);
  const int64_t D = c.hidden, I = c.inner(), F = c.ffn, P = c.rope_pairs();
  const DType bf = DType::bf16, f32 = DType::f32;
  return {
      {"residual stream x (and each norm output h)", bf, {S, D}},
      {"fused qkv output", bf, {S, 3 * I}},
      {"K (or V, or Q) alone", bf, {S, c.heads, c.head_dim}},
      {"attention output (pre out_proj)", bf, {S, I}},
      {"fc1 output (MLP expansion)", bf, {S, 2 * F}},
      {"swiglu intermediate", bf, {S, F}},
      {"rope table", bf, {S, P, 2, 2}},
      {"rope angles", f32, {S, 2 * P}},
      {"final-layer modulated video rows", f32, {video_tokens, D}},
  };
}

BlockMemory h3_block_memory_stock(const H3Config& c, int64_t S) {
  LS_CHECK(S >= 0);
  const int64_t D = c.hidden, I = c.inner(), F = c.ffn;
  const DType bf = DType::bf16;
  const MemoryItem x{"residual x", bf, {S, D}}, h{"norm output h", bf, {S, D}};
  BlockMemory m;
  m.plan = "stock (all tokens at once)";
  m.residual_bytes = x.bytes();
  m.phases.push_back({"attention", {x, h, {"qkv", bf, {S, 3 * I}}, {"attn out", bf, {S, I}}, {"out_proj out", bf, {S, D}}}});
  m.phases.push_back({"MLP", {x, h, {"fc1 out", bf, {S, 2 * F}}, {"swiglu", bf, {S, F}}, {"fc2 out", bf, {S, D}}}});
  return m;
}

BlockMemory h3_block_memory_sliced(const H3Config& cfg, int64_t S, int64_t slice_tokens) {
  LS_CHECK(S >= 0 && slice_tokens > 0);
  const int64_t D = cfg.hidden, I = cfg.inner(), F = cfg.ffn, c = std::min(slice_tokens, S);
  const DType bf = DType::bf16, f32 = DType::f32;
  const MemoryItem x{"residual x", bf, {S, D}}, k{"K (resident)", bf, {S, I}}, v{"V (resident)", bf, {S, I}};
  const MemoryItem h{"norm output h (slice)", bf, {c, D}};
  BlockMemory m;
  m.plan = "sliced (" + std::to_string(slice_tokens) + "-token slices, K/V resident)";
  m.slice_tokens = slice_tokens;
  m.residual_bytes = x.bytes();
  m.phases.push_back({"pass 1 (K, V for all tokens)", {x, k, v, h, {"k,v GEMM out (slice)", bf, {c, 2 * I}}}});
  m.phases.push_back({"pass 2 (Q, attention, out_proj per slice)",
                      {x, k, v, h,
                       {"q (slice)", bf, {c, I}},
                       {"attention fp32 accumulator (slice)", f32, {c, I}},
                       {"attention running max, sum (slice)", f32, {c, cfg.heads, 2}},
                       {"attn out (slice)", bf, {c, I}},
                       {"out_proj out (slice)", bf, {c, D}}}});
  m.phases.push_back({"MLP (per slice)",
                      {x, h, {"fc1 out (slice)", bf, {c, 2 * F}}, {"swiglu (slice)", bf, {c, F}},
                       {"fc2 out (slice)", bf, {c, D}}}});
  return m;
}

}  // namespace ls::h3
