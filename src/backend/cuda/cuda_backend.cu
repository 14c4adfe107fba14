// CudaBackend: the Backend interface on one CUDA device (DESIGN.md §3).
//
// Memory: MemoryResource over cudaMalloc (the arena takes its one block from it);
// nothing else in the backend allocates device memory but count_nonfinite's 8-byte
// counter (made once in init()); pinned_host_memory() is a MemoryResource over
// cudaHostAlloc for the host side of streamed copies. Both resources consult the
// allocation-fault hook (core/alloc_fault.h) before allocating. Work: one
// compute stream per backend; every op and copy is queued on it in call order, so ops
// see the results of earlier ops without extra synchronisation. A second non-blocking
// stream (Queue::transfer) carries copy_async copies that overlap with compute; the two
// are ordered only by the kFences fences (cudaEvents without timing). cuBLASLt's workspace is handed in by the
// caller (set_workspace), with a fixed size so algorithm choice never depends on it.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/cuda/attention_cudnn.cuh"
#include "backend/cuda/attention_hopper.cuh"
#include "backend/cuda/attention_hopper_int8.cuh"
#include "backend/cuda/int8_p8_check.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ext.h"
#include "backend/cuda/linear_quant_bench.cuh"
#include "backend/cuda/ops.cuh"
#include "backend/cuda/pack.cuh"
#include "backend/int8_attention_math.h"
#include "core/alloc_fault.h"

namespace ls::cuda {

void cuda_check_failed(const char* call, const char* func, const char* file, int line, const char* what) {
  std::fprintf(stderr, "CUDA call failed: %s\n  in %s at %s:%d\n  error: %s\n", call, func, file, line, what);
  std::fflush(stderr);
  std::abort();
}

Error cuda_error(cudaError_t e, const std::string& what) {
  cudaGetLastError();  // clear a sticky-free error so later calls are not blamed
  ErrorCode code = e == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::device;
  return make_error(code, what + ": " + cudaGetErrorString(e));
}

Error cublas_error(cublasStatus_t s, const std::string& what) {
  return make_error(ErrorCode::device, what + ": " + cublasLtGetStatusString(s));
}

Status unsupported(const char* op, const std::string& detail) {
  return make_error(ErrorCode::unsupported, std::string("cuda ") + op + ": " + detail);
}

namespace {

// Makes `device` current for the calling thread for the scope (cheap when it already is).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    LS_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) LS_CUDA_CHECK(cudaSetDevice(device));
    set_ = prev_ != device;
  }
  ~DeviceGuard() {
    if (set_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool set_ = false;
};

class CudaMemoryResource final : public MemoryResource {
 public:
  explicit CudaMemoryResource(int device) : device_(device) {}
  Device device() const override { return Device{DeviceKind::cuda, device_}; }
  Expected<void*> allocate(size_t bytes) override {
    DeviceGuard g(device_);
    if (bytes == 0) return static_cast<void*>(nullptr);
    void* p = nullptr;
    // A test's injected failure (core/alloc_fault.h) takes the path of a real one.
    const bool injected = testing::allocation_should_fail();
    cudaError_t e = injected ? cudaErrorMemoryAllocation : cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      size_t free_b = 0, total_b = 0;
      cudaGetLastError();
      cudaMemGetInfo(&free_b, &total_b);
      return cuda_error(e, "cudaMalloc of " + format_bytes(bytes) + " on cuda:" + std::to_string(device_) + " (" +
                               format_bytes(free_b) + " free of " + format_bytes(total_b) +
                               "); lower the memory budget" + (injected ? " (injected allocation failure)" : ""));
    }
    testing::allocation_made();
    return p;
  }
  void deallocate(void* p, size_t) override {
    if (!p) return;
    DeviceGuard g(device_);
    LS_CUDA_CHECK(cudaFree(p));
    testing::allocation_released();
  }

 private:
  int device_;
};

// Page-locked host memory for streamed copies (weights, offloaded K/V and residual):
// cudaHostAlloc'd, so cudaMemcpyAsync from/to it runs asynchronously on the copy
// engines. It lives on the host (device() is the host Device{}); the CUDA device is
// made current for the calls so the allocation is mapped for it.
class CudaPinnedHostResource final : public MemoryResource {
 public:
  explicit CudaPinnedHostResource(int device) : device_(device) {}
  Device device() const override { return Device{}; }
  Expected<void*> allocate(size_t bytes) override {
    DeviceGuard g(device_);
    if (bytes == 0) return static_cast<void*>(nullptr);
    void* p = nullptr;
    const bool injected = testing::allocation_should_fail();
    cudaError_t e = injected ? cudaErrorMemoryAllocation : cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (e != cudaSuccess)
      return cuda_error(e, "cudaHostAlloc of " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                               " bytes) of pinned host memory for cuda:" + std::to_string(device_) +
                               "; lower the host offload budget or free host memory" +
                               (injected ? " (injected allocation failure)" : ""));
    testing::allocation_made();
    return p;
  }
  void deallocate(void* p, size_t) override {
    if (!p) return;
    DeviceGuard g(device_);
    LS_CUDA_CHECK(cudaFreeHost(p));
    testing::allocation_released();
  }

 private:
  int device_;
};

// True when every dimension after the first is packed (rows may have any stride).
bool rows_packed(const TensorView& v) {
  int64_t s = 1;
  for (int i = v.ndim - 1; i >= 1; --i) {
    if (v.shape[static_cast<size_t>(i)] != 1 && v.stride[static_cast<size_t>(i)] != s) return false;
    s *= v.shape[static_cast<size_t>(i)];
  }
  return true;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const cudaDeviceProp& prop) : mem_(device), pinned_(device), prop_name_(prop.name) {
    ctx_.device = device;
    ctx_.sm_count = prop.multiProcessorCount;
    ctx_.max_smem_optin = prop.sharedMemPerBlockOptin;
    sm_90_ = prop.major == 9 && prop.minor == 0;
    LS_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    LS_CUDA_CHECK(cudaStreamCreateWithFlags(&transfer_stream_, cudaStreamNonBlocking));
    // Fences only order work, they never time it: no timing makes record/wait cheaper.
    for (cudaEvent_t& f : fences_) LS_CUDA_CHECK(cudaEventCreateWithFlags(&f, cudaEventDisableTiming));
    LS_CUDA_CHECK(cudaEventCreateWithFlags(&interop_event_, cudaEventDisableTiming));
    LS_CUBLAS_CHECK(cublasLtCreate(&ctx_.lt));
    ctx_.gemm_cache = gemm_cache_create();
    auto defaults = resolve(Numerics{});
    LS_CHECK_MSG(defaults.ok(), "cuda: the default numerics do not resolve");
    ctx_.numerics = *defaults;
  }
  // Backend state that can fail for lack of memory (make_cuda_backend calls it once):
  // count_nonfinite's 8-byte device counter. Plain cudaMalloc, outside the arenas and
  // the allocation-fault hook (it holds no tensor; the streams and the cuBLASLt handle
  // above also take device memory of their own).
  Status init() {
    DeviceGuard g(ctx_.device);
    cudaError_t e = cudaMalloc(&ctx_.nonfinite_counter, sizeof(unsigned long long));
    if (e != cudaSuccess) {
      ctx_.nonfinite_counter = nullptr;
      return cuda_error(e, "cudaMalloc of the non-finite counter on cuda:" + std::to_string(ctx_.device));
    }
    return Status();
  }
  ~CudaBackend() override {
    DeviceGuard g(ctx_.device);
    // Both queues drain before anything they may still use is destroyed.
    cudaStreamSynchronize(ctx_.stream);
    cudaStreamSynchronize(transfer_stream_);
    if (ctx_.nonfinite_counter) cudaFree(ctx_.nonfinite_counter);
    gemm_cache_destroy(ctx_.gemm_cache);
    cublasLtDestroy(ctx_.lt);
    for (cudaEvent_t f : fences_) cudaEventDestroy(f);
    cudaEventDestroy(interop_event_);
    cudaStreamDestroy(transfer_stream_);
    cudaStreamDestroy(ctx_.stream);
  }

  Device device() const override { return Device{DeviceKind::cuda, ctx_.device}; }
  std::string name() const override { return "cuda:" + std::to_string(ctx_.device) + " (" + prop_name_ + ")"; }
  MemoryResource& memory() override { return mem_; }

  Status copy(const TensorView& dst, const TensorView& src) override {
    DeviceGuard g(ctx_.device);
    return copy_on(dst, src, ctx_.stream);
  }

  // ---- streaming -----------------------------------------------------------------
  MemoryResource& pinned_host_memory() override { return pinned_; }
  Status copy_async(const TensorView& dst, const TensorView& src, Queue q) override {
    DeviceGuard g(ctx_.device);
    return copy_on(dst, src, stream_of(q));
  }
  Status signal(Queue q, int fence) override {
    DeviceGuard g(ctx_.device);
    cudaError_t e = cudaEventRecord(fence_at(fence), stream_of(q));
    if (e != cudaSuccess) return cuda_error(e, "signal fence " + std::to_string(fence) + " on the " + queue_name(q) + " queue");
    return Status();
  }
  // A fence never signalled is a completed cudaEvent, so waiting on it returns at once.
  Status wait(Queue q, int fence) override {
    DeviceGuard g(ctx_.device);
    cudaError_t e = cudaStreamWaitEvent(stream_of(q), fence_at(fence), 0);
    if (e != cudaSuccess)
      return cuda_error(e, "wait for fence " + std::to_string(fence) + " on the " + queue_name(q) + " queue");
    return Status();
  }
  Status host_wait(int fence) override {
    DeviceGuard g(ctx_.device);
    cudaError_t e = cudaEventSynchronize(fence_at(fence));
    if (e != cudaSuccess) return cuda_error(e, "host wait for fence " + std::to_string(fence));
    return Status();
  }

  Status device_memory_info(uint64_t* free_bytes, uint64_t* total_bytes) override {
    DeviceGuard g(ctx_.device);
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);
    if (e != cudaSuccess) return cuda_error(e, "cudaMemGetInfo on cuda:" + std::to_string(ctx_.device));
    *free_bytes = f;
    *total_bytes = t;
    return Status();
  }

  Status synchronize() override {
    DeviceGuard g(ctx_.device);
    // All work queued on this backend: both queues.
    cudaError_t e = cudaStreamSynchronize(ctx_.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(transfer_stream_);
    if (e != cudaSuccess) return cuda_error(e, "cuda:" + std::to_string(ctx_.device) + " synchronize");
    return Status();
  }

  // The workspace of the description (backend/description.h: the GEMM's cuBLASLt
  // workspace and staging, then the quantised linears' region, or in a build with cuDNN
  // the cuDNN attention scratch for up to 64 heads of 128 (H3: 56 x 128) at the numerics'
  // cudnn_q_chunk where larger, whichever attention path the numerics select), so
  // switching between cudnn and native (set_numerics) keeps a workspace valid; only a
  // larger q chunk needs a larger one (set_numerics refuses it once a smaller workspace
  // is set). Ops run one at a time on the compute queue, so they share one view.
  // tests/cuda/test_backend_description_cuda.cpp checks the description's pieces against
  // what gemm.cu, linear_quant.cu and attention_cudnn.cu carve.
  size_t workspace_bytes() const override { return workspace_bytes_for(ctx_.numerics); }
  static size_t workspace_bytes_for(const Numerics& n) { return static_cast<size_t>(description().workspace_bytes(n)); }
  static const BackendDescription& description() {
    static const BackendDescription d = cuda_description(cuda_build());
    return d;
  }

  // ---- numerics ------------------------------------------------------------------
  // Resolution (numerics.h): attention auto -> hopper for a model of head dim 128 on an
  // sm_90 device in a build with the Hopper kernel (set_model_head_dim; the fastest that
  // passes the parity and invariance tests there: 603-615 TFLOP/s at S = 111274 against
  // cuDNN's 552-553 on the H200, bench/results/issue15/), else the description's default
  // (cudnn where the build has cuDNN, else native); kv_tile 0 -> the algorithm's default
  // (AttentionEntry::default_kv_tile, where the description says why). native_variant ""
  // -> "4x2" under native attention. The knobs of the path not taken must stay at their
  // defaults (they would be recorded without acting). What cannot run here is refused
  // with the description's message (can_implement_attention).
  // auto takes hopper only where nothing given belongs to another path (a cudnn_* knob or
  // native_variant set with auto keeps that path) and the kernel can run here.
  static bool auto_takes_hopper(const Numerics& n, int64_t head_dim, int device) {
    const Numerics defaults;
    return head_dim > 0 && description().can_implement_attention(AttentionAlgorithm::hopper, head_dim).ok() &&
           n.native_variant.empty() && n.cudnn_q_chunk == defaults.cudnn_q_chunk && n.cudnn_form.empty() &&
           n.cudnn_skip_configs == 0 && attention_hopper_available(device).ok();
  }
  static Expected<Numerics> resolve(const Numerics& n, int64_t head_dim = 0, int device = 0) {
    LS_TRY(validate(n));
    Numerics r = n;
    if (r.attention == AttentionAlgorithm::backend_default)
      r.attention = auto_takes_hopper(n, head_dim, device) ? AttentionAlgorithm::hopper : description().default_attention();
    if (r.attention == AttentionAlgorithm::cudnn) LS_TRY(description().can_implement_attention(r.attention));
    const Numerics defaults;
    if (r.attention == AttentionAlgorithm::cudnn) {
      if (!r.native_variant.empty())
        return make_error(ErrorCode::invalid_argument,
                          "native_variant '" + r.native_variant +
                              "' is a setting of the native attention kernel, but the attention is cudnn; "
                              "select attention native or leave native_variant empty");
    } else if (r.attention == AttentionAlgorithm::int8) {
      if (!r.native_variant.empty() || r.cudnn_q_chunk != defaults.cudnn_q_chunk || !r.cudnn_form.empty() ||
          r.cudnn_skip_configs != 0)
        return make_error(ErrorCode::invalid_argument,
                          "native_variant and the cudnn_* knobs are settings of the native and cudnn attention "
                          "paths, but the attention is int8 (" + describe(r) + "); leave them at their defaults");
    } else if (r.attention == AttentionAlgorithm::hopper) {
      if (!r.native_variant.empty() || r.cudnn_q_chunk != defaults.cudnn_q_chunk || !r.cudnn_form.empty() ||
          r.cudnn_skip_configs != 0)
        return make_error(ErrorCode::invalid_argument,
                          "native_variant and the cudnn_* knobs are settings of the native and cudnn attention "
                          "paths, but the attention is hopper (" + describe(r) + "); leave them at their defaults");
    } else {
      if (r.cudnn_q_chunk != defaults.cudnn_q_chunk || !r.cudnn_form.empty() || r.cudnn_skip_configs != 0)
        return make_error(ErrorCode::invalid_argument,
                          "cudnn_q_chunk, cudnn_form and cudnn_skip_configs are settings of the cudnn attention "
                          "path, but the attention is native (" + describe(r) +
                              "); select attention cudnn or leave them at their defaults");
      if (r.native_variant.empty()) r.native_variant = kDefaultNativeVariant;
    }
    if (r.kv_tile == 0) r.kv_tile = description().default_kv_tile(r.attention);
    return r;
  }
  Status set_numerics(const Numerics& n, const Diagnostics& d) override { return apply_numerics(n, d, head_dim_); }
  Status set_model_head_dim(int64_t head_dim) override {
    if (head_dim < 0) return make_error(ErrorCode::invalid_argument, "set_model_head_dim: negative head dim");
    return apply_numerics(requested_, ctx_.diagnostics, head_dim);
  }
  // set_numerics and set_model_head_dim: resolve n for head_dim, check, then keep n as
  // given (auto stays auto, to be resolved again for another model) and the result.
  Status apply_numerics(const Numerics& n, const Diagnostics& d, int64_t head_dim) {
    // [int8 attention] the portable kernels (attention_int8.cu): head dim 128, kv_tile 128.
    if (n.attention == AttentionAlgorithm::int8 && head_dim != 0 && head_dim != 128)
      return make_error(ErrorCode::unsupported,
                        name() + " cannot run attention int8 for a model of head dim " + std::to_string(head_dim) +
                            ": its int8 kernels take head dim 128; its attention algorithms here are native" +
                            std::string(attention_cudnn_built() ? ", cudnn" : "") + " (and auto); the CPU backend runs "
                            "int8 at any power-of-two head dim");
    if (n.attention == AttentionAlgorithm::int8 && n.kv_tile != 0 && n.kv_tile != kInt8DefaultKvTile)
      return make_error(ErrorCode::invalid_argument,
                        name() + ": attention int8 folds once per 128-key tile on CUDA: kv_tile must be 128 (or 0, "
                                 "the default); got " + std::to_string(n.kv_tile));
    LS_ASSIGN_OR_RETURN(Numerics r, resolve(n, head_dim, ctx_.device));
    if (r.attention == AttentionAlgorithm::hopper) LS_TRY(attention_hopper_available(ctx_.device));
    if (ctx_.workspace != nullptr && ctx_.workspace_bytes < workspace_bytes_for(r))
      return make_error(ErrorCode::invalid_argument,
                        "cuda set_numerics: " + describe(r) + " needs " + std::to_string(workspace_bytes_for(r)) +
                            " bytes of workspace, the view set has " + std::to_string(ctx_.workspace_bytes) +
                            "; call set_numerics before set_workspace (workspace_bytes() follows the numerics)");
    // Ops read the settings on the host when they are queued, so work already queued
    // keeps the old ones and nothing waits; the cuBLASLt pins follow the candidates, so
    // they are forgotten when those change.
    if (r.gemm_candidate != ctx_.numerics.gemm_candidate) gemm_cache_clear(ctx_.gemm_cache);
    ctx_.numerics = r;
    ctx_.diagnostics = d;
    requested_ = n;
    head_dim_ = head_dim;
    return Status();
  }
  Numerics numerics() const override { return ctx_.numerics; }
  Diagnostics diagnostics() const override { return ctx_.diagnostics; }

  Status set_workspace(const TensorView& ws) override {
    LS_CHECK_MSG(ws.empty() || ws.device == device(), "set_workspace: view on " + ws.device.str());
    if (!ws.empty() && static_cast<size_t>(ws.nbytes()) < workspace_bytes())
      return make_error(ErrorCode::invalid_argument, "cuda set_workspace: " + std::to_string(ws.nbytes()) +
                                                         " bytes given, workspace_bytes() = " +
                                                         std::to_string(workspace_bytes()) + " needed");
    ctx_.workspace = ws.data;
    ctx_.workspace_bytes = ws.empty() ? 0 : static_cast<size_t>(ws.nbytes());
    return Status();
  }

  Status gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_gemm(ctx_, x, w, bias, out);
  }
  Status rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_rms_norm(ctx_, x, w, eps, out);
  }
  Status rms_norm_modulate(const TensorView& x, const TensorView& w, float eps, const TensorView& shift,
                           const TensorView& scale, const TensorView& rows, const TensorView& out) override {
    if (!cuda_rms_norm_modulate_applies(x, w, shift, scale, rows, out))
      return Backend::rms_norm_modulate(x, w, eps, shift, scale, rows, out);  // the composition
    DeviceGuard g(ctx_.device);
    return cuda_op_rms_norm_modulate(ctx_, x, w, eps, shift, scale, rows, out);
  }
  Status modulate(const TensorView& in, const TensorView& shift, const TensorView& scale, const TensorView& rows,
                  const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_modulate(ctx_, in, shift, scale, rows, out);
  }
  Status gated_add(const TensorView& x, const TensorView& y, const TensorView& gate, const TensorView& rows) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_gated_add(ctx_, x, y, gate, rows);
  }
  Status add(const TensorView& x, const TensorView& y) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_add(ctx_, x, y);
  }
  Status qk_norm_rope(const TensorView& x, const TensorView& w, const TensorView& rope, float eps) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_qk_norm_rope(ctx_, x, w, rope, eps);
  }
  Status swiglu(const TensorView& u, const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_swiglu(ctx_, u, out);
  }
  Status silu(const TensorView& x) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_silu(ctx_, x);
  }
  Status time_embedding(const TensorView& t, const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_time_embedding(ctx_, t, out);
  }
  Status convert(const TensorView& src, const TensorView& dst) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_convert(ctx_, src, dst);
  }
  Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                   const AttentionParams& p) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_attention(ctx_, q, k, v, out, p);
  }
  Status int8_key_stats(const TensorView& k, const TensorView& v, const TensorView& stats, int64_t k0,
                        bool reset) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_int8_key_stats(ctx_, k, v, stats, k0, reset);
  }
  Status int8_prepare(const TensorView& k, const TensorView& v, const TensorView& stats,
                      const Int8Keys& keys) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_int8_prepare(ctx_, k, v, stats, keys);
  }
  // Attention int8 (docs/int8-attention.md): the Hopper kernel (attention_hopper_int8.cu) on
  // sm_90 where the build has it and the call fits it (int8_hopper_fits: H % 4 == 0, aligned
  // rows), else the portable kernel (attention_int8.cu). Both give the CPU reference's bytes
  // (tests/cuda/test_attention_int8_cuda.cpp), so the choice is no numerics setting;
  // cuda::set_int8_attention_kernel (cuda_ext.h) forces the portable one for tests and benches.
  Status attention_int8(const TensorView& q, const Int8Keys& keys, const TensorView& out,
                        const AttentionParams& p) override {
    if (!i8a::scale_ok(p.scale)) return make_error(ErrorCode::invalid_argument, i8a::scale_error(p.scale));
    DeviceGuard g(ctx_.device);
    const bool table = int8_p8_table();
    if (int8_hopper_fits(q, keys, out, p)) return attention_hopper_int8(ctx_, q, keys, out, p, table, !int8_grid_);
    return cuda_op_attention_int8(ctx_, q, keys, out, p, table);
  }
  // p8 (contract v2, int8_p8_check.cuh): the fast ex2 byte where this device's ex2 gives the
  // table on every pattern (checked once per device, on first use), else the table path (the
  // fast byte corrected against the thresholds); cuda::set_int8_p8_path(b, "table") forces
  // the table path (tests, benchmarks).
  bool int8_p8_table() const { return int8_p8_forced_table_ || !int8_p8_check(ctx_.device).ex2; }
  std::string int8_p8() const { return int8_p8_table() ? "table" : "ex2"; }
  void set_int8_p8_table(bool table) { int8_p8_forced_table_ = table; }
  bool int8_hopper_fits(const TensorView& q, const Int8Keys& keys, const TensorView& out,
                        const AttentionParams& p) const {
    return !int8_portable_ && attention_hopper_int8_built() && cuda::int8_hopper_fits(sm_90_, q, keys, out, p).empty();
  }
  // "hopper" where calls of head dim 128 with H % 4 == 0 run the Hopper kernel, else "portable".
  std::string int8_kernel() const {
    return !int8_portable_ && attention_hopper_int8_built() && sm_90_ ? "hopper" : "portable";
  }
  void set_int8_kernel(bool portable, bool grid) {
    int8_portable_ = portable;
    int8_grid_ = grid;
  }
  Expected<int64_t> count_nonfinite(const TensorView& t) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_count_nonfinite(ctx_, t);
  }
  // Latent packing (pack.cu): the target latents stay on the device (issue 13).
  Status pack_video_rows(const TensorView& lat, int64_t r0, const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_pack_video_rows(ctx_, lat, r0, out);
  }
  Status pack_audio_rows(const TensorView& lat, float carry, int64_t r0, const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_pack_audio_rows(ctx_, lat, carry, r0, out);
  }
  Status unpack_video_rows(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_unpack_video_rows(ctx_, rows, mask, r0, out);
  }
  Status unpack_audio_rows(const TensorView& rows, const TensorView& mask, const AudioCarryOut& c, int64_t r0,
                           const TensorView& out) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_unpack_audio_rows(ctx_, rows, mask, c, r0, out);
  }
  Status linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                const LinearOptions& opts) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_linear(ctx_, x, w, bias, out, opts);
  }
  Status lora_side(const TensorView& x, const LoraSide& side, const TensorView& out,
                   const LinearOptions& opts) override {
    DeviceGuard g(ctx_.device);
    return cuda_op_lora_side(ctx_, x, side, out, opts);
  }
  // The caller's stream and ours, ordered by one event each way (no device-wide sync).
  Status wait_external(void* stream) override {
    DeviceGuard g(ctx_.device);
    cudaError_t e = cudaEventRecord(interop_event_, static_cast<cudaStream_t>(stream));
    if (e == cudaSuccess) e = cudaStreamWaitEvent(ctx_.stream, interop_event_, 0);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(transfer_stream_, interop_event_, 0);
    if (e != cudaSuccess) return cuda_error(e, "wait for the caller's stream");
    return Status();
  }
  Status signal_external(void* stream) override {
    DeviceGuard g(ctx_.device);
    auto s = static_cast<cudaStream_t>(stream);
    cudaError_t e = cudaEventRecord(interop_event_, transfer_stream_);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, interop_event_, 0);
    if (e == cudaSuccess) e = cudaEventRecord(interop_event_, ctx_.stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(s, interop_event_, 0);
    if (e != cudaSuccess) return cuda_error(e, "order the caller's stream after the engine's work");
    return Status();
  }

  CudaContext& context() { return ctx_; }

 private:
  cudaStream_t stream_of(Queue q) const {
    LS_CHECK_MSG(q == Queue::compute || q == Queue::transfer, "unknown queue " + std::to_string(static_cast<int>(q)));
    return q == Queue::compute ? ctx_.stream : transfer_stream_;
  }
  static const char* queue_name(Queue q) { return q == Queue::compute ? "compute" : "transfer"; }
  cudaEvent_t fence_at(int fence) const {
    LS_CHECK_MSG(fence >= 0 && fence < kFences, "fence " + std::to_string(fence) + " out of range [0, " +
                                                   std::to_string(kFences) + ")");
    return fences_[static_cast<size_t>(fence)];
  }

  // copy() and copy_async(): dst <- src queued on `stream`, never synchronising.
  Status copy_on(const TensorView& dst, const TensorView& src, cudaStream_t stream) {
    LS_CHECK_MSG(dst.dtype == src.dtype && dst.ndim == src.ndim, "copy: " + dst.shape_str() + " <- " + src.shape_str());
    for (int i = 0; i < dst.ndim; ++i)
      LS_CHECK_MSG(dst.shape[static_cast<size_t>(i)] == src.shape[static_cast<size_t>(i)],
                   "copy: " + dst.shape_str() + " <- " + src.shape_str());
    if (dst.numel() == 0) return Status();
    const size_t es = static_cast<size_t>(dst.elem_size());
    cudaError_t e;
    if (dst.is_contiguous() && src.is_contiguous()) {
      e = cudaMemcpyAsync(dst.data, src.data, static_cast<size_t>(dst.numel()) * es, cudaMemcpyDefault, stream);
    } else {
      LS_CHECK_MSG(rows_packed(dst) && rows_packed(src), "copy: views must be contiguous or row-strided");
      const int64_t rows = dst.shape[0];
      const size_t width = static_cast<size_t>(dst.numel() / rows) * es;
      e = cudaMemcpy2DAsync(dst.data, static_cast<size_t>(dst.stride[0]) * es, src.data,
                            static_cast<size_t>(src.stride[0]) * es, width, static_cast<size_t>(rows),
                            cudaMemcpyDefault, stream);
    }
    if (e != cudaSuccess) return cuda_error(e, "copy " + src.shape_str() + " " + src.device.str() + " -> " + dst.device.str());
    return Status();
  }

  CudaContext ctx_;
  CudaMemoryResource mem_;
  CudaPinnedHostResource pinned_;
  cudaStream_t transfer_stream_ = nullptr;  // Queue::transfer (non-blocking)
  Numerics requested_;    // the numerics as last given (attention auto kept: set_model_head_dim)
  int64_t head_dim_ = 0;  // the model's head dim (set_model_head_dim; 0 = not known)
  std::array<cudaEvent_t, kFences> fences_{};
  cudaEvent_t interop_event_ = nullptr;  // wait_external / signal_external (recorded, then waited on at once)
  std::string prop_name_;
  bool sm_90_ = false;          // compute capability 9.0 (the Hopper kernels)
  bool int8_portable_ = false;  // set_int8_attention_kernel("portable")
  bool int8_grid_ = false;      // set_int8_attention_kernel("hopper-grid"): one CTA per item
  bool int8_p8_forced_table_ = false;  // set_int8_p8_path("table")
};

}  // namespace

// ---- cuda_ext.h ------------------------------------------------------------------
Expected<std::unique_ptr<PinnedHostBuffer>> PinnedHostBuffer::create(size_t bytes) {
  void* p = nullptr;
  const bool injected = bytes != 0 && testing::allocation_should_fail();
  cudaError_t e = injected ? cudaErrorMemoryAllocation : cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
  if (e != cudaSuccess)
    return cuda_error(e, "cudaHostAlloc of " + format_bytes(bytes) + " pinned host memory" +
                             (injected ? " (injected allocation failure)" : ""));
  if (p) testing::allocation_made();
  return std::unique_ptr<PinnedHostBuffer>(new PinnedHostBuffer(p, bytes));
}
PinnedHostBuffer::~PinnedHostBuffer() {
  if (!data_) return;
  LS_CUDA_CHECK(cudaFreeHost(data_));
  testing::allocation_released();
}

Stream::Stream(int device) : device_(device) {
  DeviceGuard g(device_);
  LS_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
}
Stream::~Stream() {
  DeviceGuard g(device_);
  cudaStreamDestroy(s_);
}
void Stream::synchronize() const { LS_CUDA_CHECK(cudaStreamSynchronize(s_)); }

Event::Event(int device, bool timing) : device_(device) {
  DeviceGuard g(device_);
  LS_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  DeviceGuard g(device_);
  cudaEventDestroy(e_);
}
void Event::record(cudaStream_t s) const { LS_CUDA_CHECK(cudaEventRecord(e_, s)); }
void Event::wait_on(cudaStream_t s) const { LS_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }
void Event::synchronize() const { LS_CUDA_CHECK(cudaEventSynchronize(e_)); }
float Event::elapsed_ms(const Event& start, const Event& stop) {
  float ms = 0.0f;
  LS_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, stop.e_));
  return ms;
}

cudaStream_t compute_stream(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  return c ? c->context().stream : nullptr;
}
int device_index(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  return c ? c->context().device : -1;
}
Status set_int8_attention_kernel(Backend& b, const std::string& kernel) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return make_error(ErrorCode::invalid_argument, "set_int8_attention_kernel: not a CUDA backend");
  if (kernel != "auto" && kernel != "portable" && kernel != "hopper-grid")
    return make_error(ErrorCode::invalid_argument,
                      "set_int8_attention_kernel: '" + kernel + "' (auto, hopper-grid or portable)");
  c->set_int8_kernel(kernel == "portable", kernel == "hopper-grid");
  return Status();
}
std::string int8_attention_kernel(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  return c ? c->int8_kernel() : "";
}
Status set_int8_p8_path(Backend& b, const std::string& path) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return make_error(ErrorCode::invalid_argument, "set_int8_p8_path: not a CUDA backend");
  if (path != "auto" && path != "table")
    return make_error(ErrorCode::invalid_argument, "set_int8_p8_path: '" + path + "' (auto or table)");
  c->set_int8_p8_table(path == "table");
  return Status();
}
std::string int8_p8_path(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return "";
  DeviceGuard g(c->context().device);
  return c->int8_p8();
}
std::string int8_p8_check_summary(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return "";
  const Int8P8Check& r = int8_p8_check(c->context().device);
  if (!r.error.empty()) return r.error;
  return std::to_string(r.patterns) + " patterns, " + std::to_string(r.mismatches) + " mismatches, table path " +
         std::to_string(r.table_mismatches) + " mismatches, " + std::to_string(r.ms) + " ms: " + (r.ex2 ? "ex2" : "table");
}
std::string describe_pinned_gemm(Backend& b, const TensorView& x, const TensorView& w, const TensorView* bias,
                                 const TensorView& out) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return "not a CUDA backend";
  DeviceGuard g(c->context().device);
  return gemm_describe_pinned(c->context(), x, w, bias, out);
}

}  // namespace ls::cuda

namespace ls {

CudaBuild cuda_build() { return {cuda::attention_cudnn_built(), cuda::attention_hopper_built()}; }

Expected<std::unique_ptr<Backend>> make_cuda_backend(int index) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error(ErrorCode::device, std::string("no usable CUDA device (") + cudaGetErrorString(e) +
                                             "); check the NVIDIA driver or use --device cpu");
  }
  if (index < 0 || index >= count)
    return make_error(ErrorCode::device, "cuda:" + std::to_string(index) + " does not exist: this machine has " +
                                             std::to_string(count) + " CUDA device(s)");
  cudaDeviceProp prop{};
  e = cudaGetDeviceProperties(&prop, index);
  if (e != cudaSuccess) return cuda::cuda_error(e, "cudaGetDeviceProperties(cuda:" + std::to_string(index) + ")");
  if (prop.major < 8)
    return make_error(ErrorCode::unsupported, std::string("cuda:") + std::to_string(index) + " (" + prop.name +
                                                  ") has compute capability " + std::to_string(prop.major) + "." +
                                                  std::to_string(prop.minor) + "; LayerStream needs 8.0 or newer");
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(index);
  auto b = std::make_unique<cuda::CudaBackend>(index, prop);
  cudaSetDevice(prev);
  LS_TRY(b->init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace ls
