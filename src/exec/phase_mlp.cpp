#include "exec/phase_mlp.h"

#include <algorithm>

namespace ls::exec {

Status run_mlp(ForwardState& st, const MlpSpecs& specs, const h3::DitBlock& blk, int64_t slice) {
  Arena& arena = st.arena;
  // This rank's rows (all S with one rank).
  const int64_t r0 = st.row0, r1 = st.row1;
  Arena::Scope phase(arena);
  // Residual offload: slice i + 1's rows come in while slice i computes, slice i - 1's
  // go back (ResidualWalk; reads and writes every row once).
  LS_ASSIGN_OR_RETURN(ResidualWalk walk, ResidualWalk::begin(st, specs.residual_slice, std::min(r1 - r0, slice),
                                                             row_slices(r0, r1, slice), /*reads=*/true, /*writes=*/true));
  for (const auto& [a, b] : row_slices(r0, r1, slice)) {
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, specs.h, b - a));             // bf16 [n, D]
    LS_ASSIGN_OR_RETURN(TensorView u, alloc_rows(arena, specs.fc1_out, b - a));       // bf16 [n, 2F]
    LS_ASSIGN_OR_RETURN(TensorView act, alloc_rows(arena, specs.swiglu_out, b - a));  // bf16 [n, F]
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, walk.in(a, b));
    LS_TRY(blk.mlp(r, a, b, h, u, act));
    LS_TRY(walk.out(r, a, b));
  }
  return walk.finish();
}

}  // namespace ls::exec
