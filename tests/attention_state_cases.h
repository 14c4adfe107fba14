// The malformed attention-state settings every attention implementation refuses with
// invalid_argument (AttentionParams::state, backend.h), shared by the CPU test
// (test_attention_state.cpp) and the CUDA one (cuda/test_streaming_ops.cpp).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace ls::test {

// call(p, keys): the backend's attention over the first `keys` keys of a case with
// `kv_tile` keys per tile (at least 40 keys, kv_tile 16), writing a bf16 output.
// `state`: a well-formed state for the case; `bad_states`: views that must be refused as
// a state, each with its name (with finalize false and true alike). Also refused: a
// non-final chunk that is not whole tiles, state_in or !finalize without a state.
inline void expect_state_refusals(const std::function<Status(const AttentionParams&, int64_t)>& call,
                                  const TensorView& state, int64_t kv_tile,
                                  const std::vector<std::pair<TensorView, std::string>>& bad_states) {
  auto code_of = [&](const AttentionParams& p, int64_t keys) {
    const Status s = call(p, keys);
    if (!s.ok()) std::printf("  expected failure: %s\n", s.message().c_str());
    return s.ok() ? std::string("ok") : std::string(to_string(s.error().code));
  };
  const std::string invalid = to_string(ErrorCode::invalid_argument);
  AttentionParams p;
  p.kv_tile = kv_tile;
  p.state = state;
  p.finalize = false;
  EXPECT_EQ(code_of(p, 2 * kv_tile + kv_tile / 2), invalid)
      << "a non-final chunk of " << 2 * kv_tile + kv_tile / 2 << " keys with kv_tile " << kv_tile;
  EXPECT_EQ(code_of(p, 2 * kv_tile), "ok");
  for (const auto& [view, what] : bad_states)
    for (bool fin : {false, true}) {
      AttentionParams b = p;
      b.state = view;
      b.finalize = fin;
      EXPECT_EQ(code_of(b, 2 * kv_tile), invalid) << "state " << what << " " << view.shape_str() << " finalize " << fin;
    }
  AttentionParams none;
  none.kv_tile = kv_tile;
  none.state_in = true;
  EXPECT_EQ(code_of(none, 2 * kv_tile), invalid) << "state_in without a state";
  none.state_in = false;
  none.finalize = false;
  EXPECT_EQ(code_of(none, 2 * kv_tile), invalid) << "!finalize without a state";
}

}  // namespace ls::test
