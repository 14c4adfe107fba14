#include "exec/phase_embed.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/pack.h"

namespace ls::exec {

Status run_embed(ForwardState& st, const EmbedSpecs& specs, int64_t slice, const h3::PackedLayout& lay,
                 const h3::EmbedInputs& inputs, const TensorView& text, const WeightStore& weights) {
  Backend& be = st.be;
  Arena& arena = st.arena;
  // This rank's rows (all S with one rank).
  const int64_t r0 = st.row0, r1 = st.row1;
  Arena::Scope phase(arena);
  // Residual offload: each slice is written into a slice buffer and copied back to the
  // host on the transfer queue while the next slice computes (ResidualWalk, writes only).
  LS_ASSIGN_OR_RETURN(ResidualWalk walk, ResidualWalk::begin(st, specs.residual_slice, std::min(r1 - r0, slice),
                                                             row_slices(r0, r1, slice), /*reads=*/false, /*writes=*/true));
  const TensorView vw = weights.get("video_patch_proj.weight"), vb = weights.get("video_patch_proj.bias");
  const TensorView aw = weights.get("audio_patch_proj.weight"), ab = weights.get("audio_patch_proj.bias");
  std::vector<float> staging;
  for (int64_t a = r0; a < r1; a += slice) {
    const int64_t b = std::min(r1, a + slice);
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView rows, alloc_rows(arena, specs.patch_rows, b - a));      // f32 [n, max(Pv, Pa)]
    LS_ASSIGN_OR_RETURN(TensorView emb, alloc_rows(arena, specs.patch_embedding, b - a));  // f32 [n, D]
    // The rows [a, b) of the residual being written: x itself or a slice buffer.
    LS_ASSIGN_OR_RETURN(const h3::BlockRows out, walk.in(a, b));
    for (const h3::Segment& s : lay.segments) {
      const int64_t lo = std::max(a, s.start), hi = std::min(b, s.stop);
      if (lo >= hi) continue;
      if (s.kind == h3::SegmentKind::text) {
        LS_TRY(be.copy(out.x_rows(lo, hi), text.slice_rows(lo, hi)));
        continue;
      }
      const int64_t w = inputs.width(s), n = hi - lo;
      // Contiguous [n, w] views at the sub-range's offset inside the slice buffers.
      const TensorView r(static_cast<float*>(rows.data) + (lo - a) * w, DType::f32, {n, w}, rows.device);
      const TensorView e = emb.slice_rows(lo - a, hi - a);
      if (s.is_target()) {
        // The target latents: packed where they live. On the engine's device the backend
        // packs straight into the slice's rows; host latents are packed by the CPU op
        // (the same arithmetic, tested by memcmp) and copied.
        const TensorView& lat = s.is_video() ? inputs.video() : inputs.audio();
        const int64_t seg_row = lo - s.start;  // the segment's row
        // (Host latents always take the CPU op, whatever the backend: a backend need not
        // implement the pack ops for host memory.)
        if (lat.device.kind != DeviceKind::cpu && lat.device == be.device()) {
          LS_TRY(s.is_video() ? be.pack_video_rows(lat, seg_row, r) : be.pack_audio_rows(lat, inputs.carry(), seg_row, r));
        } else {
          staging.resize(static_cast<size_t>(n * w));
          const TensorView h(staging.data(), DType::f32, {n, w});
          LS_TRY(s.is_video() ? cpu::cpu_op_pack_video_rows(lat, seg_row, h)
                              : cpu::cpu_op_pack_audio_rows(lat, inputs.carry(), seg_row, h));
          LS_TRY(be.copy(r, h));
        }
      } else {
        staging.resize(static_cast<size_t>(n * w));
        inputs.rows(s, lo, hi, staging.data());
        LS_TRY(be.copy(r, TensorView(staging.data(), DType::f32, {n, w})));
      }
      LS_TRY(be.gemm(r, s.is_video() ? vw : aw, s.is_video() ? &vb : &ab, e));  // fp32 GEMM + bias
      LS_TRY(be.convert(e, out.x_rows(lo, hi)));                                // -> bf16
    }
    LS_TRY(walk.out(out, a, b));
    LS_TRY(be.synchronize());  // the staging buffer is reused by the next slice
  }
  return walk.finish();
}

}  // namespace ls::exec
