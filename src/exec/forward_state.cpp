#include "exec/forward_state.h"

#include "exec/buffers.h"

namespace ls::exec {

std::string ForwardState::where() const {
  return phase_block < 0 ? std::string(phase_name) : "block " + std::to_string(phase_block) + " (" + phase_name + ")";
}

Expected<h3::BlockRows> ForwardState::residual_in(const TensorView& rs, int64_t a, int64_t b) {
  if (!residual_offload) return h3::BlockRows{x, rope, mod_rows, row0};
  const TensorView d = rs.slice_rows(0, b - a);
  LS_TRY(be.copy_async(d, x.slice_rows(a, b), Queue::compute));
  residual_bytes += static_cast<uint64_t>(d.nbytes());
  return h3::BlockRows{d, rope, mod_rows, a};
}

Status ForwardState::residual_out(const h3::BlockRows& r, int64_t a, int64_t b) {
  if (!residual_offload) return Status();
  LS_TRY(check_finite(r.x_rows(a, b)));
  LS_TRY(be.copy_async(x.slice_rows(a, b), r.x_rows(a, b), Queue::compute));
  residual_bytes += static_cast<uint64_t>((b - a) * cfg.hidden * 2);
  return Status();
}

Expected<TensorView> ForwardState::residual_slice(const std::optional<PlannedBuffer>& spec, int64_t rows) {
  if (!residual_offload) return TensorView();
  LS_CHECK_MSG(spec.has_value(), "residual offload without a planned residual slice");
  return alloc_rows(arena, *spec, rows);
}

Status ForwardState::check_finite(const TensorView& t) {
  if (!check_finite_on) return Status();
  LS_ASSIGN_OR_RETURN(const int64_t n, be.count_nonfinite(t));
  if (n == 0) return Status();
  (void)be.synchronize();  // nothing in flight when the call returns the error
  return make_error(ErrorCode::nonfinite,
                    std::to_string(n) + " non-finite value(s) (NaN or inf) in the residual stream after " + where() +
                        ", the first phase that produced one; check the checkpoint (`layerstream info --check`), "
                        "the inputs and settings such as --cfg (--allow-nonfinite writes the output anyway)");
}

}  // namespace ls::exec
