// Backends describe themselves without a device (DESIGN.md §3.1, issue 27 part 2): per
// backend kind, what each op asks of the workspace, each attention algorithm's default
// kv_tile, the queries it computes in whole blocks (row quantum) and its measured rate,
// and whether an algorithm can run here at all (CUTLASS's can_implement). The planner
// (src/exec) and the dry run (`layerstream info`) plan from a description; the backends
// resolve their numerics, size their workspace and refuse what they cannot run from the
// same one, so a number or a refusal has one source and src/exec holds no backend's
// figures. A new attention algorithm is one more AttentionEntry; a new backend kind one
// more *_description().
//
// Exactness: nothing here changes a bit except through what it documents (an entry's
// default kv_tile is what Numerics::kv_tile 0 resolves to, DESIGN.md §1.2); the rates,
// the row quantum and the workspace only size plans.
//
// Usage:
//   const BackendDescription d = cuda_description();            // a build with cuDNN and the Hopper kernel
//   const AttentionEntry* e = d.attention(AttentionAlgorithm::hopper);
//   LS_TRY(d.can_implement_attention(AttentionAlgorithm::hopper, /*head_dim=*/128));
//   uint64_t ws = d.workspace_bytes(numerics);                   // = Backend::workspace_bytes()
//   const BackendDescription live = describe_backend(backend);   // of a backend in hand
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/numerics.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ls {

class Backend;

// Throughput figures that size plans (which slice hides a transfer, which offload level
// exposes least), never a bit. Defaults: measured on the H200 (PCIe Gen5 x16, pinned
// memory on the transfer queue: bench_stream_ops 55.4 / 55.3 GB/s; cuDNN attention over
// S = 111,274 in one call 550 TFLOP/s, bench_cuda_block; the block's pinned cuBLASLt
// linears at 32k rows 714-805 TFLOP/s, 700 taken for slices). attention_tflops is the
// resolved algorithm's (AttentionEntry::tflops) once a profile is made.
struct DeviceFacts {
  double pcie_gb_per_s = 55.0;       // host -> device copy bandwidth, 1e9 B/s
  double d2h_gb_per_s = 55.0;        // device -> host copy bandwidth, 1e9 B/s
  double attention_tflops = 550.0;   // dense bf16 attention throughput, 1e12 FLOP/s
  double gemm_tflops = 700.0;        // bf16 GEMM throughput of the block's linears, 1e12 FLOP/s
};

// The workspace pieces the ops of the CUDA backend carve (src/backend/cuda: gemm.cu,
// linear_quant.cu): the GEMM's cuBLASLt workspace + fp32 staging, then the quantised
// linears' cuBLASLt workspace + row-chunk scratch. BudgetOptions' default workspace is
// the GEMM's.
constexpr uint64_t kCudaGemmWorkspaceBytes = (32ull << 20) + (32ull << 20);
constexpr uint64_t kCudaLinearQuantWorkspaceBytes = (4ull << 20) + (160ull << 20);

// The cuDNN attention path's scratch (src/backend/cuda/attention_cudnn.cu, layout()),
// each piece rounded up to 256 bytes, with Qc = q_chunk queries per cuDNN call and
// R = Qc * heads rows:
//   Qs bf16 [R, Dh] + 4 x Ot bf16 [R, Dh] + 4 x Lt f32 [R] + acc f32 [R, Dh] + L f32 [R]
//   + 64 MiB of cuDNN's own workspace.
// 64 heads x 128 at Qc = 2048: 5 x 32 MiB + 5 x 512 KiB + 64 MiB + 64 MiB = 290.5 MiB.
uint64_t cudnn_attention_workspace_bytes(int64_t heads, int64_t head_dim, int64_t q_chunk = kDefaultCudnnQChunk);

// One attention algorithm of one backend kind.
struct AttentionEntry {
  AttentionAlgorithm algorithm = AttentionAlgorithm::native;
  // False where this build or kind cannot run it; `unavailable` then says why and what to
  // do (the message set_numerics and the dry run give).
  bool available = true;
  std::string unavailable{};
  int64_t default_kv_tile = 1024;  // what Numerics::kv_tile 0 resolves to (DESIGN.md §1.2)
  double tflops = 550.0;           // measured attention rate (plans only)
  // Queries computed in whole blocks: a slice's last block is padded to it, so the planner
  // sizes attention slices in whole blocks (hopper: its CTA's 128; else 1), or, where it
  // depends on the numerics, row_quantum_of (cuDNN: Numerics::cudnn_q_chunk per call).
  int64_t row_quantum = 1;
  int64_t (*row_quantum_of)(const Numerics& resolved) = nullptr;
  // Workspace bytes this algorithm's calls take for heads x head_dim at these numerics
  // (null: none; cuDNN: cudnn_attention_workspace_bytes at the numerics' q chunk).
  uint64_t (*workspace_of)(const Numerics& resolved, int64_t heads, int64_t head_dim) = nullptr;
  // Head dims served; empty = any the backend's op accepts.
  std::vector<int64_t> head_dims{};
  // A key pre-pass before the queries (int8: per-head key statistics, then the keys
  // quantised with their scales: Backend::int8_key_stats, int8_prepare): the planner
  // counts its scratch (PlanKnobs::int8_attention) and the executor runs the pass, both
  // asking this field, never the algorithm's name.
  bool key_prepass = false;
  const char* with = "";           // "with cuDNN attention" (the dry run's wording)
  const char* quantum_unit = "";   // "chunks", "CTAs" (of the row quantum)

  int64_t quantum(const Numerics& resolved) const {
    return row_quantum_of != nullptr ? row_quantum_of(resolved) : row_quantum;
  }
  uint64_t workspace_bytes(const Numerics& resolved, int64_t heads, int64_t head_dim) const {
    return workspace_of != nullptr ? workspace_of(resolved, heads, head_dim) : 0;
  }
};

// What a build of the CUDA backend holds (a dry run describes a build it may not be).
struct CudaBuild {
  bool cudnn = true;   // LAYERSTREAM_CUDNN: cuDNN found at configure time
  bool hopper = true;  // LAYERSTREAM_HOPPER_ATTENTION: sm_90a among the architectures
};

struct BackendDescription {
  DeviceKind kind = DeviceKind::cpu;
  std::string name;                       // "cpu", "cuda"
  std::vector<AttentionEntry> algorithms;  // every concrete algorithm (auto excluded)
  // auto (backend_default) without a device: the first available of these (the CUDA
  // backend takes hopper only on an sm_90 device for head dim 128: Backend::set_model_head_dim).
  std::vector<AttentionAlgorithm> auto_order;
  uint64_t gemm_workspace_bytes = 0;          // the GEMM op's scratch
  uint64_t linear_quant_workspace_bytes = 0;  // the quantised linears' (after the GEMM's)
  // The attention scratch is sized for up to this many heads of this dim (H3: 56 x 128),
  // for every available algorithm whatever the numerics select, so switching algorithm
  // keeps a workspace valid.
  int64_t workspace_heads = 0, workspace_head_dim = 0;
  DeviceFacts rates;
  std::string rates_source;  // where `rates` were measured ("measured on the H200, PCIe Gen5")
  // One line on what the workspace holds (the dry run's "assumed"), for these numerics.
  std::string workspace_note(const Numerics& resolved) const;

  // The entry of a concrete algorithm; null for auto or one this kind never had.
  const AttentionEntry* attention(AttentionAlgorithm a) const;
  // auto without a device: the first available algorithm of auto_order.
  AttentionAlgorithm default_attention() const;
  // can_implement: ok when `a` (concrete) is available here and serves head_dim (0 = not
  // known yet); else unsupported with the entry's message.
  Status can_implement_attention(AttentionAlgorithm a, int64_t head_dim = 0) const;
  // Numerics::kv_tile 0 -> the algorithm's default.
  int64_t default_kv_tile(AttentionAlgorithm resolved) const;
  // Backend::workspace_bytes() for resolved numerics: the GEMM's and the quantised
  // linears' pieces (one after the other: a quantised linear calls the GEMM), or the
  // largest available algorithm's attention scratch where that is larger (ops run one
  // at a time and share the view).
  uint64_t workspace_bytes(const Numerics& resolved) const;
};

// The CPU reference: attention native (kv_tile 1024), no workspace. It measures no rates
// and never offloads: the H200's figures stand in.
BackendDescription cpu_description();
// The CUDA backend of a build (src/backend/cuda/cuda_backend.cu resolves and sizes from
// it): native (kv_tile 1024, 305 TFLOP/s), cudnn (8192, q_chunk-query chunks, 550),
// hopper (8192, 128-query CTAs, 605, head dim 128); rates measured on the H200 at
// S = 111,274 (bench/results/issue15/run7). tests/cuda/test_backend_description_cuda.cpp
// checks the figures against what the CUDA ops ask for.
BackendDescription cuda_description(CudaBuild build = {});

// The description of a backend in hand (its kind, and for CUDA its build). Implemented in
// src/backend/registry.cpp, the one file that knows which backends were built.
BackendDescription describe_backend(const Backend& backend);
// The entry of the attention algorithm a backend in hand runs (its resolved numerics);
// LS_CHECK that its description has one. Also in src/backend/registry.cpp.
AttentionEntry resolved_attention(const Backend& backend);

}  // namespace ls
