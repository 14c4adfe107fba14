// DiT block and refiner block (h3-model.md §2.9-2.11, §2.13). Rounding points: every op
// rounds its output to bf16 once (backend.h); the order below is ComfyUI's.
#include "model/h3/block.h"

namespace ls::h3 {

namespace {
constexpr float kEps = 1e-5f;  // norm_eps = qk_norm_eps = 1e-5
TensorView as2d(const TensorView& v) { return v.ndim == 3 ? v.flatten_last2() : v; }
}  // namespace

LinearWeight h3_linear_weight(const WeightGetter& w, const H3Config& cfg, const std::string& linear) {
  LinearWeight lw(w(linear + ".weight"));
  const LinearQuant* q = cfg.quant.find(linear);
  if (!q) {
    LS_CHECK_MSG(lw.w.dtype != DType::i8 && lw.w.dtype != DType::f8e4m3,
                 linear + ".weight is quantised but the config does not say how (cfg.quant)");
    return lw;
  }
  lw.format = q->format;
  // weight_scale as stored ([N, 1] | [N] | [] | [1]) viewed flat: f32 [N] (int8) | [1] (fp8).
  const TensorView sc = w(linear + ".weight_scale");
  LS_CHECK(sc.dtype == DType::f32 && sc.is_contiguous());
  const int64_t n = sc.numel();
  LS_CHECK(n == (q->format == WeightFormat::int8_convrot ? lw.out_features() : 1));
  lw.scale = TensorView::contiguous(sc.data, DType::f32, &n, 1, sc.device);
  if (q->format == WeightFormat::int8_convrot) lw.group = q->group;
  else {
    lw.input_scale = q->input_scale;
    lw.dynamic_act = q->dynamic_act;
  }
  // LoRAs on a quantised linear: the side factors (model/lora_source.h), applied by
  // linear_lora after the quantised linear (backend.h, Backend::lora_side).
  if (cfg.lora_side.count(linear) != 0) {
    lw.lora.down = w(linear + ".lora_side_down");  // f32 [K, R]
    lw.lora.up = w(linear + ".lora_side_up");      // f32 [N, R]
  }
  return lw;
}

static BlockWeights block_weights(const WeightGetter& w, const H3Config* cfg, const std::string& p) {
  // Without a config (the plain overloads) every linear must be a plain weight.
  static const H3Config plain;
  const H3Config& c = cfg ? *cfg : plain;
  BlockWeights b;
  b.norm1 = w(p + "norm1.weight");
  b.norm2 = w(p + "norm2.weight");
  b.attn.qkv = h3_linear_weight(w, c, p + "attn.qkv_proj");
  b.attn.q_norm = w(p + "attn.q_norm.weight");
  b.attn.k_norm = w(p + "attn.k_norm.weight");
  b.attn.out_proj = h3_linear_weight(w, c, p + "attn.out_proj");
  b.fc1 = h3_linear_weight(w, c, p + "mlp.fc1");
  b.fc2 = h3_linear_weight(w, c, p + "mlp.fc2");
  return b;
}
BlockWeights dit_block_weights(const WeightGetter& w, int64_t block) {
  return block_weights(w, nullptr, "blocks." + std::to_string(block) + ".");
}
BlockWeights refiner_block_weights(const WeightGetter& w, int64_t block) {
  return block_weights(w, nullptr, "token_refiner.blocks." + std::to_string(block) + ".");
}
BlockWeights dit_block_weights(const WeightGetter& w, const H3Config& cfg, int64_t block) {
  return block_weights(w, &cfg, "blocks." + std::to_string(block) + ".");
}
BlockWeights refiner_block_weights(const WeightGetter& w, const H3Config& cfg, int64_t block) {
  return block_weights(w, &cfg, "token_refiner.blocks." + std::to_string(block) + ".");
}

// fc2 of the MLP from the fc1 output u bf16 [n, 2F] into out bf16 [n, D]. int8 ConvRot:
// one linear over u with the fused fp32 swiglu (LS-int8 numerics, comfyui-and-quantized-
// weights.md §2.6 step 1; act untouched). Otherwise bf16(bf16(silu(gate)) * up) into act,
// then the linear (bf16: exactly the gemm; fp8: the eager swiglu ComfyUI quantises).
static Status mlp_down(Backend& be, const LinearWeight& fc2, const TensorView& u, const TensorView& act,
                       const TensorView& out) {
  if (fc2.format == WeightFormat::int8_convrot)
    return linear_lora(be, u, fc2, nullptr, out, LinearOptions{.swiglu_input = true});
  LS_TRY(be.swiglu(u, act));
  return linear_lora(be, act, fc2, nullptr, out);
}

BlockTables block_tables(const TensorView& out) {
  LS_CHECK(out.ndim == 2 && out.shape[1] % 6 == 0);
  const int64_t D = out.shape[1] / 6;
  // Chunk order of the AdaLN output (§2.6): shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp.
  return BlockTables{out.cols(0, D),         out.cols(D, 2 * D),     out.cols(2 * D, 3 * D),
                     out.cols(3 * D, 4 * D), out.cols(4 * D, 5 * D), out.cols(5 * D, 6 * D)};
}

Status DitBlock::norm_modulate(const BlockRows& r, int64_t a, int64_t b, const TensorView& norm_w,
                               const TensorView& shift, const TensorView& scale, const TensorView& h) const {
  // h = bf16(RMSNorm(x)); h = bf16(bf16(h * bf16(1 + bf16(scale))) + bf16(shift)): one op,
  // byte for byte rms_norm then modulate in place (backend.h; fused in one pass on CUDA).
  return be_.rms_norm_modulate(r.x_rows(a, b), norm_w, kEps, shift, scale, r.mod_rows.slice_rows(a, b), h);
}

Status DitBlock::attn_kv(const BlockRows& r, int64_t a, int64_t b, const TensorView& k_rows,
                         const TensorView& v_rows, const TensorView& h) const {
  const int64_t I = cfg_.inner();
  LS_CHECK(h.rows() == b - a && k_rows.rows() == b - a && v_rows.rows() == b - a);
  LS_TRY(norm_modulate(r, a, b, w_.norm1, t_.shift_msa, t_.scale_msa, h));
  // K and V projections only: the K and V row ranges of the fused qkv weight.
  LS_TRY(linear_lora(be_, h, w_.attn.qkv.rows(I, 2 * I), nullptr, as2d(k_rows)));
  LS_TRY(linear_lora(be_, h, w_.attn.qkv.rows(2 * I, 3 * I), nullptr, as2d(v_rows)));
  // Per-head k RMSNorm + split-half partial RoPE, in place (V is neither normalised nor rotated).
  return be_.qk_norm_rope(k_rows, w_.attn.k_norm, r.rope.slice_rows(a, b), kEps);
}

Status DitBlock::attn_q(const BlockRows& r, int64_t a, int64_t b, const TensorView& h, const TensorView& q) const {
  const int64_t I = cfg_.inner(), H = cfg_.heads, Dh = cfg_.head_dim;
  LS_CHECK(h.rows() == b - a && q.rows() == b - a);
  LS_TRY(norm_modulate(r, a, b, w_.norm1, t_.shift_msa, t_.scale_msa, h));
  LS_TRY(linear_lora(be_, h, w_.attn.qkv.rows(0, I), nullptr, q));  // Q rows of the fused weight
  return be_.qk_norm_rope(q.unflatten_last(H, Dh), w_.attn.q_norm, r.rope.slice_rows(a, b), kEps);
}

Status DitBlock::attn_out(const BlockRows& r, int64_t a, int64_t b, const TensorView& o, const TensorView& h) const {
  LS_CHECK(h.rows() == b - a && o.rows() == b - a);
  LS_TRY(linear_lora(be_, o, w_.attn.out_proj, nullptr, h));  // out-projection into h (h is free again)
  // x = bf16(x + proj * bf16(gate_msa)), the raw gate (no 1 +, no tanh).
  return be_.gated_add(r.x_rows(a, b), h, t_.gate_msa, r.mod_rows.slice_rows(a, b));
}

Status DitBlock::attn_q_out(const BlockRows& r, int64_t a, int64_t b, const TensorView& k_all,
                            const TensorView& v_all, const TensorView& h, const TensorView& q, const TensorView& o,
                            int64_t kv_tile) const {
  const int64_t H = cfg_.heads, Dh = cfg_.head_dim;
  LS_CHECK(o.rows() == b - a);
  LS_TRY(attn_q(r, a, b, h, q));
  AttentionParams ap;
  ap.kv_tile = kv_tile;  // scale 0 = 1/sqrt(Dh), no mask, all keys
  LS_TRY(be_.attention(q.unflatten_last(H, Dh), k_all, v_all, o.unflatten_last(H, Dh), ap));
  return attn_out(r, a, b, o, h);
}

Status DitBlock::attn_fused(const BlockRows& r, const TensorView& h, const TensorView& qkv, const TensorView& o,
                            int64_t kv_tile, const TensorView& int8_scratch) const {
  const int64_t S = r.x.rows(), I = cfg_.inner(), H = cfg_.heads, Dh = cfg_.head_dim;
  LS_TRY(norm_modulate(r, 0, S, w_.norm1, t_.shift_msa, t_.scale_msa, h));
  LS_TRY(linear_lora(be_, h, w_.attn.qkv, nullptr, qkv));  // [S, 3I] = [q | k | v]
  const TensorView q = qkv.cols(0, I).unflatten_last(H, Dh);
  const TensorView k = qkv.cols(I, 2 * I).unflatten_last(H, Dh);
  const TensorView v = qkv.cols(2 * I, 3 * I).unflatten_last(H, Dh);
  LS_TRY(be_.qk_norm_rope(q, w_.attn.q_norm, r.rope, kEps));
  LS_TRY(be_.qk_norm_rope(k, w_.attn.k_norm, r.rope, kEps));
  AttentionParams ap;
  ap.kv_tile = kv_tile;
  LS_TRY(attention_all_keys(be_, q, k, v, o.unflatten_last(H, Dh), ap, int8_scratch));
  LS_TRY(linear_lora(be_, o, w_.attn.out_proj, nullptr, h));
  return be_.gated_add(r.x, h, t_.gate_msa, r.mod_rows);
}

Status DitBlock::mlp(const BlockRows& r, int64_t a, int64_t b, const TensorView& h, const TensorView& u,
                     const TensorView& act) const {
  LS_CHECK(h.rows() == b - a && u.rows() == b - a && act.rows() == b - a);
  LS_TRY(norm_modulate(r, a, b, w_.norm2, t_.shift_mlp, t_.scale_mlp, h));
  LS_TRY(linear_lora(be_, h, w_.fc1, nullptr, u));  // [n, 2F] = [gate | up]
  LS_TRY(mlp_down(be_, w_.fc2, u, act, h));   // swiglu + fc2
  return be_.gated_add(r.x_rows(a, b), h, t_.gate_mlp, r.mod_rows.slice_rows(a, b));
}

Status refiner_block(Backend& be, const H3Config& cfg, const BlockWeights& w, const TensorView& x, const TensorView& h,
                     const TensorView& qkv, const TensorView& o, const TensorView& u, const TensorView& act,
                     int64_t kv_tile, const TensorView& int8_scratch) {
  const int64_t I = cfg.inner(), H = cfg.heads, Dh = cfg.head_dim;
  // x = Attention(norm1(x)) + x
  LS_TRY(be.rms_norm(x, w.norm1, kEps, h));
  LS_TRY(linear_lora(be, h, w.attn.qkv, nullptr, qkv));
  const TensorView q = qkv.cols(0, I).unflatten_last(H, Dh);
  const TensorView k = qkv.cols(I, 2 * I).unflatten_last(H, Dh);
  const TensorView v = qkv.cols(2 * I, 3 * I).unflatten_last(H, Dh);
  LS_TRY(be.qk_norm_rope(q, w.attn.q_norm, TensorView(), kEps));  // plain per-head RMSNorm, no rope
  LS_TRY(be.qk_norm_rope(k, w.attn.k_norm, TensorView(), kEps));
  AttentionParams ap;
  ap.kv_tile = kv_tile;
  LS_TRY(attention_all_keys(be, q, k, v, o.unflatten_last(H, Dh), ap, int8_scratch));
  LS_TRY(linear_lora(be, o, w.attn.out_proj, nullptr, h));
  LS_TRY(be.add(x, h));  // bf16(x + attn), commutative with ComfyUI's attn + x
  // x = MLP(norm2(x)) + x
  LS_TRY(be.rms_norm(x, w.norm2, kEps, h));
  LS_TRY(linear_lora(be, h, w.fc1, nullptr, u));
  LS_TRY(mlp_down(be, w.fc2, u, act, h));
  return be.add(x, h);
}

}  // namespace ls::h3
