// One pass over a stored tensor's values for NaN and inf (issue 28, item 4): the load-time
// check of what a quantised run cannot see (its activations are quantised per row, which
// maps NaN to 0 and clamps inf, so a NaN norm weight, rope.inv_freq or weight_scale would
// give finite output) and of LoRA factors and alphas.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "io/safetensors.h"

namespace ls::io {

// Non-finite elements of a float tensor (F32, BF16, F16, F8_E4M3: NaN, and inf where
// the dtype has one); other dtypes have none. `first` gets the first one's flat index
// (-1 when none). Reads the bytes unaligned-safe.
int64_t count_nonfinite(const SafetensorsReader& file, const SafetensorsEntry& e, int64_t* first = nullptr);

// ErrorCode::nonfinite "<what>: tensor NAME holds N non-finite values (NaN or inf), the
// first at element I; ..." when count_nonfinite(e) > 0, else ok. `what` names the file
// in the message ("LoRA x.safetensors", the checkpoint's path).
Status require_finite(const SafetensorsReader& file, const SafetensorsEntry& e, const std::string& what);

}  // namespace ls::io
