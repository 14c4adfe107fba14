// The streamed-keys settings of AttentionParams, checked the same way (same rules, same
// messages) by every backend (backend.h, check_attention_state).
#include <string>

#include "backend/backend.h"

namespace ls {

Status check_attention_state(const AttentionParams& p, int64_t Mq, int64_t Mk, int64_t H, int64_t Dh) {
  const bool chunked = p.state_in || !p.finalize;
  if (p.state.empty()) {
    if (chunked)
      return make_error(ErrorCode::invalid_argument,
                        "attention: state_in or !finalize needs a state view f32 [Mq, H, Dh + " +
                            std::to_string(kAttentionStateExtra) + "]; none was given");
    return Status();
  }
  const int64_t width = Dh + kAttentionStateExtra;
  if (p.state.dtype != DType::f32 || p.state.ndim != 3 || p.state.size(0) != Mq || p.state.size(1) != H ||
      p.state.size(2) != width || !p.state.is_contiguous())
    return make_error(ErrorCode::invalid_argument,
                      std::string("attention: the state must be a contiguous f32 [") + std::to_string(Mq) + ", " +
                          std::to_string(H) + ", " + std::to_string(width) + "] (queries, heads, head_dim + " +
                          std::to_string(kAttentionStateExtra) + "); got " + dtype_name(p.state.dtype) + " " +
                          p.state.shape_str() + (p.state.is_contiguous() ? "" : " (strided)"));
  if (!p.finalize && Mk % p.kv_tile != 0)
    return make_error(ErrorCode::invalid_argument,
                      "attention: a non-final key chunk must hold a multiple of kv_tile = " +
                          std::to_string(p.kv_tile) + " keys so its tiles are those of one call over all keys; got " +
                          std::to_string(Mk) + " keys (make the chunk a multiple of kv_tile, or finalize it)");
  return Status();
}

}  // namespace ls
