// Numerics: every setting that may change output bits, in one struct (DESIGN.md §1).
// Memory knobs (slices, budgets, residency, offload) are NOT here: they never change a
// bit. Everything here may, like the seed of a sampler, so it comes in with the params
// (never from the environment), is printed in the status line and stored in every JSON
// report and output file's metadata (to_json / describe).
//
// Defaults per backend (resolve()): the CPU reference has one algorithm of each kind and
// kv_tile 1024; CUDA runs cuDNN's fused attention where the build has cuDNN (kv_tile
// 8192), else the native kernel (kv_tile 1024), fp32 GEMMs in the CPU reference's lane
// order ("lanes16"), the heuristic's first admissible cuBLASLt algorithm per GEMM shape.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ls {

enum class AttentionAlgorithm {
  backend_default,  // resolved by the backend: cudnn where built (CUDA), else native
  native,           // the built-in flash kernel (CUDA) / the reference (CPU)
  cudnn,            // cuDNN's fused SDPA, one call per key tile, tiles merged in fp32 (CUDA + cuDNN)
};

enum class GemmF32Order {
  lanes16,   // the CPU reference's order: 16 lanes, then a fixed tree (CUDA gives the CPU's bytes)
  cublaslt,  // pinned cuBLASLt / SIMT path (CUDA only; another order, other bits)
};

struct Numerics {
  AttentionAlgorithm attention = AttentionAlgorithm::backend_default;
  int64_t kv_tile = 0;  // keys per attention tile; 0 = the resolved algorithm's default
  GemmF32Order gemm_f32 = GemmF32Order::lanes16;
  // Developer / experiment knobs of the CUDA kernels; each may change bits.
  std::string native_variant;      // native kernel warp layout: "" (= "4x1"), "8x1", "4x2"
  int64_t cudnn_q_chunk = 2048;    // cuDNN path: queries per staged chunk, multiple of 64 in [64, 65536]
  std::string cudnn_form;          // cuDNN graph form: "" (auto), "unified", "composite", "composite-f32p"
  int64_t cudnn_skip_configs = 0;  // cuDNN: skip the first N heuristic engine configs
  std::map<int64_t, int> gemm_candidate;  // K -> cuBLASLt candidate index (-1 key: every K); empty = heuristic's first

  bool operator==(const Numerics&) const = default;
};

// Diagnostics that never change a bit (logging only).
struct Diagnostics {
  bool gemm_verbose = false;   // print each GEMM pin
  bool cudnn_verbose = false;  // print cuDNN graph building steps
};

const char* to_string(AttentionAlgorithm a);
const char* to_string(GemmF32Order g);
// One line: "attention cudnn, kv_tile 8192, fp32 GEMM lanes16" (+ any non-default knob).
std::string describe(const Numerics& n);

}  // namespace ls
