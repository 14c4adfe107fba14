// Backend descriptions (description.h): the figures and refusals of each backend kind.
#include "backend/description.h"

#include <algorithm>
#include <utility>

#include "core/arena.h"

namespace ls {

uint64_t cudnn_attention_workspace_bytes(int64_t heads, int64_t head_dim, int64_t q_chunk) {
  LS_CHECK(heads > 0 && head_dim > 0 && q_chunk > 0);
  auto up = [](uint64_t b) { return (b + 255) / 256 * 256; };  // attention_cudnn.cu's kAlign
  const uint64_t rows = static_cast<uint64_t>(q_chunk) * static_cast<uint64_t>(heads);
  const uint64_t tile_bf16 = up(rows * static_cast<uint64_t>(head_dim) * 2);  // Qs, each Ot
  const uint64_t tile_lse = up(rows * 4);                                      // each Lt, L
  const uint64_t acc = up(rows * static_cast<uint64_t>(head_dim) * 4);
  constexpr uint64_t kTilesPerMerge = 4, kCudnnReserve = 64ull << 20;
  return tile_bf16 * (1 + kTilesPerMerge) + tile_lse * (kTilesPerMerge + 1) + acc + kCudnnReserve;
}

const AttentionEntry* BackendDescription::attention(AttentionAlgorithm a) const {
  for (const AttentionEntry& e : algorithms)
    if (e.algorithm == a) return &e;
  return nullptr;
}

AttentionAlgorithm BackendDescription::default_attention() const {
  for (AttentionAlgorithm a : auto_order)
    if (const AttentionEntry* e = attention(a); e != nullptr && e->available) return a;
  LS_CHECK_MSG(false, name + ": no attention algorithm available");
  return AttentionAlgorithm::native;
}

Status BackendDescription::can_implement_attention(AttentionAlgorithm a, int64_t head_dim) const {
  const AttentionEntry* e = attention(a);
  if (e == nullptr)
    return make_error(ErrorCode::unsupported, std::string("attention ") + to_string(a) + ": the " + name +
                                                  " backend has no such algorithm");
  if (!e->available) return make_error(ErrorCode::unsupported, e->unavailable);
  if (head_dim > 0 && !e->head_dims.empty() &&
      std::find(e->head_dims.begin(), e->head_dims.end(), head_dim) == e->head_dims.end()) {
    std::string dims;
    for (int64_t d : e->head_dims) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    return make_error(ErrorCode::unsupported, std::string("attention ") + to_string(a) + " on " + name +
                                                  " serves head dim " + dims + ", the model has " +
                                                  std::to_string(head_dim) + "; use attention auto or native");
  }
  return Status();
}

int64_t BackendDescription::default_kv_tile(AttentionAlgorithm resolved) const {
  const AttentionEntry* e = attention(resolved);
  LS_CHECK_MSG(e != nullptr, std::string("default_kv_tile of an unresolved algorithm: ") + to_string(resolved));
  return e->default_kv_tile;
}

uint64_t BackendDescription::workspace_bytes(const Numerics& resolved) const {
  uint64_t attn = 0;
  for (const AttentionEntry& e : algorithms)
    if (e.available) attn = std::max(attn, e.workspace_bytes(resolved, workspace_heads, workspace_head_dim));
  return std::max(gemm_workspace_bytes + linear_quant_workspace_bytes, attn);
}

std::string BackendDescription::workspace_note(const Numerics& resolved) const {
  if (kind == DeviceKind::cpu) return "none: the CPU's row tiles are fixed-size stack buffers";
  const AttentionEntry* cudnn = attention(AttentionAlgorithm::cudnn);
  if (cudnn != nullptr && cudnn->available)
    return "a build with cuDNN, max(cuBLASLt + quantised linears " + std::to_string((gemm_workspace_bytes + linear_quant_workspace_bytes) >> 20) +
           " MiB, cuDNN attention scratch for " + std::to_string(workspace_heads) + " heads x " +
           std::to_string(workspace_head_dim) + " at " + std::to_string(resolved.cudnn_q_chunk) + "-query chunks " +
           format_bytes(cudnn->workspace_bytes(resolved, workspace_heads, workspace_head_dim)) + ")";
  return "a build without cuDNN, the cuBLASLt GEMM's " + std::to_string(gemm_workspace_bytes >> 20) +
         " MiB + the quantised linears' " + std::to_string(linear_quant_workspace_bytes >> 20) + " MiB";
}

namespace {
// An algorithm this kind never runs, with the refusal's message.
AttentionEntry unavailable(AttentionAlgorithm a, std::string why) {
  AttentionEntry e;
  e.algorithm = a;
  e.available = false;
  e.unavailable = std::move(why);
  return e;
}
}  // namespace

BackendDescription cpu_description() {
  BackendDescription d;
  d.kind = DeviceKind::cpu;
  d.name = "cpu";
  const AttentionEntry native{
      .algorithm = AttentionAlgorithm::native, .default_kv_tile = 1024, .with = "with the reference attention"};
  d.algorithms = {native,
                  unavailable(AttentionAlgorithm::cudnn,
                              "the cpu backend has no cuDNN attention (it runs the reference, attention native); use "
                              "--device cuda or attention auto|native"),
                  unavailable(AttentionAlgorithm::hopper,
                              "the cpu backend has no Hopper attention kernel (it runs the reference, attention "
                              "native); use --device cuda on an sm_90 GPU or attention auto|native")};
  // [int8 attention] the reference (docs/int8-attention.md): any power-of-two head dim (the
  // CPU backend checks it), kv_tile 128 as on CUDA so default runs compare byte for byte.
  d.algorithms.push_back(AttentionEntry{.algorithm = AttentionAlgorithm::int8,
                                        .default_kv_tile = kInt8DefaultKvTile,
                                        .key_prepass = true,
                                        .with = "with the int8 reference attention"});
  d.auto_order = {AttentionAlgorithm::native};
  d.rates_source = "measured on the H200, PCIe Gen5";  // none measured here: they plan nothing on the CPU
  return d;
}

BackendDescription cuda_description(CudaBuild build) {
  BackendDescription d;
  d.kind = DeviceKind::cuda;
  d.name = "cuda";
  d.gemm_workspace_bytes = kCudaGemmWorkspaceBytes;
  d.linear_quant_workspace_bytes = kCudaLinearQuantWorkspaceBytes;
  d.workspace_heads = 64;
  d.workspace_head_dim = 128;
  // The native kernel walks 64-key blocks whatever kv_tile is, so it keeps the CPU's 1024.
  const AttentionEntry native{.algorithm = AttentionAlgorithm::native,
                              .default_kv_tile = 1024,
                              .tflops = 305.0,
                              .head_dims = {32, 64, 128},
                              .with = "with the native attention kernel"};
  // cuDNN's fused kernel is called once per key tile and the tiles merged: at S = 111,274,
  // H3 width, on the H200, kv_tile 1024 ran at 438 TFLOP/s, 8192 at 552-555, 16384 at
  // 559-567: 8192 is within 2 % of the best. Each call's last query chunk is padded.
  const AttentionEntry cudnn{
      .algorithm = AttentionAlgorithm::cudnn,
      .available = build.cudnn,
      .unavailable = "attention cudnn: this layerstream was built without cuDNN (no libcudnn found at configure "
                     "time); use attention auto or native, or rebuild with cuDNN installed",
      .default_kv_tile = 8192,
      .tflops = DeviceFacts{}.attention_tflops,
      .row_quantum_of = [](const Numerics& n) { return n.cudnn_q_chunk; },
      .workspace_of = [](const Numerics& n, int64_t heads, int64_t head_dim) {
        return cudnn_attention_workspace_bytes(heads, head_dim, n.cudnn_q_chunk);
      },
      .with = "with cuDNN attention",
      .quantum_unit = "chunks"};
  // The sm_90a kernel: blocks of 128 keys give the same bits for every kv_tile that is a
  // multiple of 128, so its default is cuDNN's 8192 (whole-tile K/V offload chunks as
  // large as cuDNN's); 128-query CTAs; 603-615 TFLOP/s at S = 111,274.
  const AttentionEntry hopper{
      .algorithm = AttentionAlgorithm::hopper,
      .available = build.hopper,
      .unavailable = "attention hopper: this layerstream was built without the Hopper kernel (CUDA architecture 90 "
                     "not in CMAKE_CUDA_ARCHITECTURES); use attention auto, native or cudnn, or rebuild with 90",
      .default_kv_tile = 8192,
      .tflops = 605.0,
      .row_quantum = 128,
      .head_dims = {128},
      .with = "with the hopper attention kernel",
      .quantum_unit = "CTAs"};
  // [int8 attention] head dim 128, kv_tile 128 only (the kernels fold the fp32 state once per
  // 128-key tile). Where the build has the sm_90a kernels the CUDA backend runs the Hopper
  // kernel (attention_hopper_int8.cu) on sm_90 GPUs, else the portable mma.sync kernel
  // (attention_int8.cu, sm_80+); the same bytes either way. On the H200 at S = 111,274, by the
  // bf16 FLOP count (contract v2): 586 TOP/s Hopper, 225 portable (one run,
  // bench/results/issue26/run8; v1: 346 and 117, run 5).
  // No row quantum (the contract has none; a slice's last 128-query CTA is padded, a small
  // cost kept out of the plans). Never auto's choice.
  const AttentionEntry int8{.algorithm = AttentionAlgorithm::int8,
                            .default_kv_tile = kInt8DefaultKvTile,
                            .tflops = build.hopper ? 586.0 : 225.0,
                            .head_dims = {128},
                            .key_prepass = true,
                            .with = build.hopper ? "with the int8 attention kernel (Hopper on sm_90, else portable)"
                                                 : "with the int8 attention kernel"};
  d.algorithms = {native, cudnn, hopper, int8};
  d.auto_order = {AttentionAlgorithm::cudnn, AttentionAlgorithm::native};
  d.rates_source = "measured on the H200, PCIe Gen5";
  return d;
}

}  // namespace ls
