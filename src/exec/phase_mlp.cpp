#include "exec/phase_mlp.h"

#include <algorithm>

namespace ls::exec {

Status run_mlp(ForwardState& st, const MlpSpecs& specs, const h3::DitBlock& blk, int64_t slice) {
  Arena& arena = st.arena;
  // This rank's rows (all S with one rank).
  const int64_t r0 = st.row0, r1 = st.row1;
  Arena::Scope phase(arena);
  LS_ASSIGN_OR_RETURN(TensorView rs, st.residual_slice(specs.residual_slice, std::min(r1 - r0, slice)));
  for (int64_t a = r0; a < r1; a += slice) {
    const int64_t b = std::min(r1, a + slice);
    Arena::Scope slice_scope(arena);
    LS_ASSIGN_OR_RETURN(TensorView h, alloc_rows(arena, specs.h, b - a));             // bf16 [n, D]
    LS_ASSIGN_OR_RETURN(TensorView u, alloc_rows(arena, specs.fc1_out, b - a));       // bf16 [n, 2F]
    LS_ASSIGN_OR_RETURN(TensorView act, alloc_rows(arena, specs.swiglu_out, b - a));  // bf16 [n, F]
    LS_ASSIGN_OR_RETURN(const h3::BlockRows r, st.residual_in(rs, a, b));
    LS_TRY(blk.mlp(r, a, b, h, u, act));
    LS_TRY(st.residual_out(r, a, b));
  }
  return Status();
}

}  // namespace ls::exec
