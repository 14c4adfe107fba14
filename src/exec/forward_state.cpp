#include "exec/forward_state.h"

#include <algorithm>

#include "exec/buffers.h"

namespace ls::exec {

std::string ForwardState::where() const {
  return phase_block < 0 ? std::string(phase_name) : "block " + std::to_string(phase_block) + " (" + phase_name + ")";
}

RowRanges row_slices(int64_t lo, int64_t hi, int64_t step) {
  LS_CHECK(step > 0);
  RowRanges r;
  for (int64_t a = lo; a < hi; a += step) r.emplace_back(a, std::min(hi, a + step));
  return r;
}

Expected<ResidualBuffers> ForwardState::residual_buffers(const std::optional<ResidualSliceSpecs>& spec, int64_t rows) {
  ResidualBuffers r;
  if (!residual_offload) return r;
  LS_CHECK_MSG(spec.has_value(), "residual offload without its planned residual slices");
  for (int j = 0; j < 2; ++j) {
    LS_ASSIGN_OR_RETURN(r.buf[j], alloc_rows(arena, spec->buf[j], rows));
    if (!res_ready[j]) {
      LS_ASSIGN_OR_RETURN(Backend::Fence f, be.take_fence());
      res_ready[j].emplace(std::move(f));
    }
    if (!res_done[j]) {
      LS_ASSIGN_OR_RETURN(Backend::Fence f, be.take_fence());
      res_done[j].emplace(std::move(f));
    }
  }
  return r;
}

Expected<ResidualWalk> ResidualWalk::begin(ForwardState& st, const std::optional<ResidualSliceSpecs>& spec,
                                           int64_t rows, RowRanges ranges, bool reads, bool writes) {
  LS_ASSIGN_OR_RETURN(const ResidualBuffers bufs, st.residual_buffers(spec, rows));
  return begin(st, bufs, std::move(ranges), reads, writes);
}

Expected<ResidualWalk> ResidualWalk::begin(ForwardState& st, const ResidualBuffers& bufs, RowRanges ranges, bool reads,
                                           bool writes) {
  ResidualWalk w;
  w.st_ = &st;
  w.ranges_ = std::move(ranges);
  w.reads_ = reads;
  w.writes_ = writes;
  w.offload_ = st.residual_offload;
  if (!w.offload_) return w;
  LS_CHECK_MSG(!bufs.buf[0].empty() && !bufs.buf[1].empty() && st.res_ready[0] && st.res_done[0],
               "residual offload without its slice buffers");
  w.buf_[0] = bufs.buf[0];
  w.buf_[1] = bufs.buf[1];
  for (size_t i = 0; i < 2; ++i) {
    if (i < w.ranges_.size()) LS_TRY(w.load(i));
    else LS_TRY(st.res_ready[i]->signal(Queue::transfer));  // unused buffer: finish() waits on it
  }
  return w;
}

Status ResidualWalk::load(size_t i) {
  const int j = static_cast<int>(i % 2);
  if (reads_) {
    const auto [a, b] = ranges_[i];
    LS_CHECK_MSG(b - a <= buf_[j].shape[0], "a residual range longer than its slice buffer");
    LS_TRY(st_->be.copy_async(buf_[j].slice_rows(0, b - a), st_->x.slice_rows(a, b), Queue::transfer));
    st_->residual_bytes += static_cast<uint64_t>((b - a) * st_->cfg.hidden * 2);
  }
  return st_->res_ready[j]->signal(Queue::transfer);
}

Expected<h3::BlockRows> ResidualWalk::in(int64_t a, int64_t b) {
  LS_CHECK_MSG(next_ < ranges_.size() && ranges_[next_] == std::make_pair(a, b),
               "residual rows taken out of the walk's order");
  if (!offload_) return st_->device_rows();
  const int j = static_cast<int>(next_ % 2);
  LS_TRY(st_->res_ready[j]->wait(Queue::compute));
  return h3::BlockRows{buf_[j].slice_rows(0, b - a), st_->rope, st_->mod_rows, a};
}

Status ResidualWalk::out(const h3::BlockRows& r, int64_t a, int64_t b) {
  LS_CHECK_MSG(next_ < ranges_.size() && ranges_[next_] == std::make_pair(a, b), "residual rows given back out of order");
  const size_t i = next_++;
  if (!offload_) return Status();
  const int j = static_cast<int>(i % 2);
  Backend& be = st_->be;
  if (writes_) LS_TRY(st_->check_finite(r.x_rows(a, b)));
  LS_TRY(st_->res_done[j]->signal(Queue::compute));
  LS_TRY(st_->res_done[j]->wait(Queue::transfer));
  if (writes_) {
    LS_TRY(be.copy_async(st_->x.slice_rows(a, b), r.x_rows(a, b), Queue::transfer));
    st_->residual_bytes += static_cast<uint64_t>((b - a) * st_->cfg.hidden * 2);
  }
  if (i + 2 < ranges_.size()) return load(i + 2);
  return st_->res_ready[j]->signal(Queue::transfer);
}

Status ResidualWalk::finish() {
  LS_CHECK_MSG(next_ == ranges_.size(), "a residual walk finished before its last range");
  if (!offload_) return Status();
  for (int j = 0; j < 2; ++j) LS_TRY(st_->res_ready[j]->wait(Queue::compute));
  return Status();
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
