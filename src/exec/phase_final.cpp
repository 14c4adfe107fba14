#include "exec/phase_final.h"

#include <algorithm>

#include "model/h3/final_layer.h"

namespace ls::exec {

namespace {

// Host view of rows [a, b) of a contiguous host buffer [*, cols].
TensorView host_rows(std::vector<float>& v, int64_t cols, int64_t a, int64_t b) {
  return TensorView(v.data() + a * cols, DType::f32, {b - a, cols});
}

}  // namespace

Status run_final(ForwardState& st, const FinalSpecs& specs, int64_t slice, const h3::PackedLayout& lay,
                 const TensorView& final_table, const WeightStore& weights, const std::optional<PddHeads>& pdd,
                 const OutputMapping& om, const TensorView& video_dev, const TensorView& audio_dev,
                 std::vector<float>& vout, std::vector<float>& aout) {
  Backend& be = st.be;
  Arena& arena = st.arena;
  const h3::H3Config& cfg = st.cfg;
  const int64_t S = st.S, D = cfg.hidden;
  const h3::Segment& sa = lay.target_audio();
  const h3::Segment& sv = lay.target_video();
  const int64_t Pv = cfg.video_patch_dim(), Pa = cfg.audio_latents_dim;
  if (video_dev.empty()) vout.assign(static_cast<size_t>(sv.rows() * Pv), 0.0f);
  if (audio_dev.empty()) aout.assign(static_cast<size_t>(sa.rows() * Pa), 0.0f);
  Arena::Scope phase(arena);
  // This rank's target rows [f0, f1) (all of [sa.start, S) with one rank).
  const int64_t f0 = std::max(sa.start, st.row0), f1 = st.row1;
  // Residual offload: slice i + 1's target rows come in while slice i computes (reads only).
  LS_ASSIGN_OR_RETURN(ResidualWalk walk, ResidualWalk::begin(st, specs.residual_slice, std::min(S - sa.start, slice),
                                                             row_slices(f0, f1, slice), /*reads=*/true, /*writes=*/false));
  TensorView vw = weights.get("final_layer.video_out.weight"), vb = weights.get("final_layer.video_out.bias");
  TensorView aw = weights.get("final_layer.audio_out.weight"), ab = weights.get("final_layer.audio_out.bias");
  TensorView pdd_w, pdd_b;
  bool pdd_holds_video = false;
  if (pdd) {
    LS_CHECK_MSG(specs.pdd_head && specs.pdd_bias, "a PDD bank without its planned head buffers");
    LS_ASSIGN_OR_RETURN(pdd_w, alloc_rows(arena, *specs.pdd_head, Pv));  // f32 [Pv, D]
    LS_ASSIGN_OR_RETURN(TensorView pb, alloc_rows(arena, *specs.pdd_bias, Pv));
    pdd_b = TensorView(pb.data, DType::f32, {Pv}, pb.device);
    aw = TensorView(pdd_w.data, DType::f32, {Pa, D}, pdd_w.device);
    ab = TensorView(pdd_b.data, DType::f32, {Pa}, pdd_b.device);
    LS_TRY(be.copy(aw, TensorView(const_cast<float*>(pdd->audio.w.data()), DType::f32, {Pa, D})));
    LS_TRY(be.copy(ab, TensorView(const_cast<float*>(pdd->audio.b.data()), DType::f32, {Pa})));
  }
  const TensorView shift = final_table.cols(0, D), scale = final_table.cols(D, 2 * D);
  const TensorView norm_w = weights.get("final_layer.norm.weight");
  const int64_t pw = specs.head_out.cols;
  for (int64_t a = f0; a < f1; a += slice) {
    const int64_t b = std::min(f1, a + slice);
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, specs.h, b - a));            // bf16 [n, D]
    LS_ASSIGN_OR_RETURN(TensorView mod, alloc_rows(arena, specs.modulated, b - a));  // f32 [n, D]
    LS_ASSIGN_OR_RETURN(TensorView out, alloc_rows(arena, specs.head_out, b - a));   // f32 [n, max(Pv, Pa)]
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk.in(a, b));
    for (const h3::Segment* s : {&sa, &sv}) {
      const int64_t lo = std::max(a, s->start), hi = std::min(b, s->stop);
      if (lo >= hi) continue;
      const bool is_v = s->is_video();
      const int64_t ow = is_v ? Pv : Pa, n = hi - lo;
      if (pdd && is_v && !pdd_holds_video) {
        vw = pdd_w;
        vb = pdd_b;
        LS_TRY(be.copy(vw, TensorView(const_cast<float*>(pdd->video.w.data()), DType::f32, {Pv, D})));
        LS_TRY(be.copy(vb, TensorView(const_cast<float*>(pdd->video.b.data()), DType::f32, {Pv})));
        pdd_holds_video = true;
      }
      const TensorView o(static_cast<float*>(out.data) + (lo - a) * pw, DType::f32, {n, ow}, out.device);
      LS_TRY(h3::final_layer_rows(be, r.x_rows(lo, hi), st.final_rows, lo, hi, shift, scale, norm_w, is_v ? vw : aw,
                                  is_v ? vb : ab, h.slice_rows(lo - a, hi - a), mod.slice_rows(lo - a, hi - a), o));
      const TensorView& dev = is_v ? video_dev : audio_dev;
      if (dev.empty()) {
        std::vector<float>& dst = is_v ? vout : aout;
        LS_TRY(be.copy(host_rows(dst, ow, lo - s->start, hi - s->start), o));
        continue;
      }
      // On the device: the slice's mask values into the modulated rows' buffer (f32
      // [n, D], D >= 1 floats per row; the head GEMM above has read it, and work on the
      // compute queue runs in order), then the rows into the caller's latent.
      const std::vector<float>& mask = is_v ? om.video_mask : om.audio_mask;
      TensorView mv;
      if (!mask.empty()) {
        mv = TensorView(mod.slice_rows(lo - a, hi - a).data, DType::f32, {n}, mod.device);
        LS_TRY(be.copy(mv, TensorView(const_cast<float*>(mask.data()) + (lo - s->start), DType::f32, {n})));
      }
      LS_TRY(is_v ? be.unpack_video_rows(o, mv, lo - s->start, dev)
                  : be.unpack_audio_rows(o, mv, om.carry, lo - s->start, dev));
    }
    LS_TRY(walk.out(r, a, b));
  }
  LS_TRY(walk.finish());
  return be.synchronize();
}

}  // namespace ls::exec
