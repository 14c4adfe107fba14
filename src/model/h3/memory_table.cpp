// Activation sizes of an H3 forward; see memory_table.h for the arithmetic.
#include "model/h3/memory_table.h"

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

}  // namespace ls::h3
