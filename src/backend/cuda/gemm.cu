// GEMM: out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n])  (PyTorch's F.linear).
//
// bf16 x bf16 and f32 x f32 go through cuBLASLt with a PINNED algorithm: the first call
// for a key (x/w/out/bias dtypes, K, operand alignment class) asks cuBLASLt's heuristic
// for candidates at a fixed reference shape (M = N = 8192, so the choice never depends
// on the first call's M or N), keeps only configurations with split-K = 1 and no
// reduction scheme that fit the fixed workspace, and uses the first of them for every
// later call with that key, whatever M and N. With split-K off, each output element is
// produced by one CTA walking K in the kernel's fixed k-tile order, so a row's result
// does not depend on which other rows (M slicing) or columns (N slicing: the Q rows of
// a fused qkv weight alone) are computed with it. This is checked on the GPU by
// tests/cuda/test_backend_ops (M = 1..1024 sweep and column slices, memcmp).
// Measured on an H200: unpinned cuBLAS changes bits for small M, so pinning matters.
//
// fp32 GEMMs use CUBLAS_COMPUTE_32F (never TF32). f32 x with bf16 w (fp32 islands with
// bf16-stored weights) has no cuBLASLt mapping, so it runs a plain SIMT kernel whose
// per-element order is: acc = 0; for k ascending: acc = fmaf(x[k], w[k], acc); then
// acc + bias (fp32), then one rounding.
//
// fp32 accuracy (GoldenOps.Gemm/cuda, gemm_f32_k1000: error vs fp64 4.5e-6 max /
// 6.3e-7 rel L2 against PyTorch's 7.3e-7 / 1.5e-7 and the CPU's 5.8e-7 / 1.8e-7): not a
// TF32 or fast mode (compute type is CUBLAS_COMPUTE_32F, scale type R_32F), but the
// reduction order: the admissible candidates (split-K 1, no reduction scheme) keep one
// fp32 accumulator per output and walk K sequentially (error ~ sqrt(K) eps), and so
// does the f32 x bf16 SIMT kernel; PyTorch's cuBLAS picks a split-K kernel at that
// small shape, the CPU reference keeps 16 lane sums and adds them as a tree.
// So f32 x f32 and f32 x bf16 go to gemm_f32_lanes16 by default (Numerics::gemm_f32 =
// cublaslt, of the backend's numerics, selects the path above; it changes bits like
// Numerics::gemm_candidate),
// which computes the CPU reference's order (src/backend/cpu/gemm.cpp) exactly:
//   acc[l] = acc[l] + fl32(x[k] * w[k]) for k = l (mod 16), K zero-padded to 16;
//   sum = ((acc[l] + acc[l+8]) -> + [l+4] -> + [l+2] -> + [l+1]); out = round(sum + bias)
// so its bytes equal the CPU backend's (error as the CPU's), row- and column-invariant by
// construction. Checked on the H200 (2026-11-30): GoldenOps.Gemm/cuda errors equal the
// CPU's (gemm_f32_k1000: 5.8e-7 max / 1.8e-7 rel L2, where the cuBLASLt path had 4.5e-6 /
// 6.3e-7), CudaOps.GemmParity and GemmPinnedSliceInvariance pass. The fp32 GEMMs are
// the patch embedding, the output heads and the AdaLN/time-embedder islands: small next
// to the bf16 block GEMMs, so a SIMT kernel costs nothing measurable there.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/ops.cuh"

namespace ls::cuda {

// Fixed so the algorithm choice never depends on how much scratch a caller has. The
// workspace holds cuBLASLt's scratch, then an fp32 staging area for bias combinations
// cuBLASLt's epilogue does not take (e.g. f32 bias with bf16 output): those run the
// pinned no-bias f32-output GEMM in row chunks into the staging area, then add the
// bias in fp32 and round once (the same math as the epilogue: fl32(acc) + bias).
constexpr size_t kGemmWorkspaceBytes = 32ull << 20;
constexpr size_t kGemmStageBytes = 32ull << 20;
constexpr int64_t kHeuristicRefDim = 8192;

struct GemmKey {
  int xt, wt, ot, bt;  // DType as int; bt = -1 without bias
  int64_t K;
  int align;  // bytes every operand row start is aligned to (16, 8, 4 or 2)
  auto tie() const { return std::tie(xt, wt, ot, bt, K, align); }
  bool operator<(const GemmKey& o) const { return tie() < o.tie(); }
};

struct GemmPlan {
  bool ok = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  std::string desc;
  std::string error;
};

struct GemmAlgoCache {
  std::mutex mu;
  std::map<GemmKey, GemmPlan> plans;
};

GemmAlgoCache* gemm_cache_create() { return new GemmAlgoCache(); }
void gemm_cache_destroy(GemmAlgoCache* c) { delete c; }
void gemm_cache_clear(GemmAlgoCache* c) {
  std::lock_guard<std::mutex> lock(c->mu);
  c->plans.clear();
}
size_t gemm_workspace_bytes() { return kGemmWorkspaceBytes + kGemmStageBytes; }

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::bf16: return CUDA_R_16BF;
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

int align_of(const void* p, int64_t ld_bytes) {
  const uint64_t v = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(ld_bytes) | 16u;
  return static_cast<int>(v & (~v + 1));  // lowest set bit, at most 16
}

// RAII holders for the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~LtDescs() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Column-major view of the row-major problem: D (N x M, ld = out row stride) =
// op(A) * B with A = w stored K x N (ld = w row stride, transposed) and B = x stored
// K x M (ld = x row stride).
cublasStatus_t make_descs(LtDescs& d, DType xt, DType wt, DType ot, int bias_t, const void* bias, int64_t M,
                          int64_t N, int64_t K, int64_t ldx, int64_t ldw, int64_t ldo) {
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasStatus_t s = cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  if (bias_t >= 0) {
    const cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep));
    const cudaDataType_t bt = cuda_type(static_cast<DType>(bias_t));
    cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt));
    cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  }
  s = cublasLtMatrixLayoutCreate(&d.a, cuda_type(wt), static_cast<uint64_t>(K), static_cast<uint64_t>(N), ldw);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  s = cublasLtMatrixLayoutCreate(&d.b, cuda_type(xt), static_cast<uint64_t>(K), static_cast<uint64_t>(M), ldx);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return cublasLtMatrixLayoutCreate(&d.c, cuda_type(ot), static_cast<uint64_t>(N), static_cast<uint64_t>(M), ldo);
}

template <typename T>
T algo_attr(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t what) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&a, what, &v, sizeof(v), &written);
  return v;
}

std::string describe_algo(const cublasLtMatmulAlgo_t& a, size_t ws) {
  std::ostringstream os;
  os << "algo " << algo_attr<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID) << " tile "
     << algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID) << " stages "
     << algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID) << " splitk "
     << algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) << " red "
     << algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME) << " swizzle "
     << algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING) << " custom "
     << algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION) << " inner "
     << algo_attr<uint16_t>(a, CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID) << " cluster "
     << algo_attr<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID) << " ws " << ws;
  return os.str();
}

// Numerics::gemm_candidate: the entry for K, else the -1 entry (every K), else -1 = none.
int candidate_override(const Numerics& n, int64_t K) {
  if (auto it = n.gemm_candidate.find(K); it != n.gemm_candidate.end()) return std::max(0, it->second);
  if (auto it = n.gemm_candidate.find(-1); it != n.gemm_candidate.end()) return std::max(0, it->second);
  return -1;
}

GemmPlan choose_plan(CudaContext& ctx, const GemmKey& key) {
  GemmPlan plan;
  const DType xt = static_cast<DType>(key.xt), wt = static_cast<DType>(key.wt), ot = static_cast<DType>(key.ot);
  // A dummy non-null bias pointer: the heuristic only looks at the bias dtype.
  static const float dummy = 0.0f;
  LtDescs d;
  cublasStatus_t s = make_descs(d, xt, wt, ot, key.bt, key.bt >= 0 ? &dummy : nullptr, kHeuristicRefDim,
                                kHeuristicRefDim, key.K, key.K, key.K, kHeuristicRefDim);
  if (s != CUBLAS_STATUS_SUCCESS) {
    plan.error = std::string("cublasLt descriptors: ") + cublasLtGetStatusString(s);
    return plan;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  LS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kGemmWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  const uint32_t al = static_cast<uint32_t>(key.align);
  for (auto a : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                 CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, a, &al, sizeof(al));
  constexpr int kRequested = 32;
  cublasLtMatmulHeuristicResult_t res[kRequested] = {};
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(ctx.lt, d.op, d.a, d.b, d.c, d.c, pref, kRequested, res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
    plan.error = std::string("no cuBLASLt algorithm (") + cublasLtGetStatusString(s) + ")";
    return plan;
  }
  // Admissible: split-K 1, no reduction scheme, fits the fixed workspace.
  std::vector<int> admissible;
  for (int i = 0; i < found; ++i) {
    if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const uint32_t splitk = algo_attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    const uint32_t red = algo_attr<uint32_t>(res[i].algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    if (splitk > 1 || red != CUBLASLT_REDUCTION_SCHEME_NONE || res[i].workspaceSize > kGemmWorkspaceBytes) continue;
    admissible.push_back(i);
  }
  if (admissible.empty()) {
    plan.error = "no cuBLASLt candidate with split-K 1 and no reduction scheme";
    return plan;
  }
  // Which one: the heuristic's first admissible candidate, unless
  // the numerics' gemm_candidate says otherwise (experiments: it changes bits, like
  // kv_tile). Both depend only on the key and the heuristic's list for the fixed
  // reference shape, so one process and the next pin the same algorithm. Timing the
  // candidates instead (bench/bench_gemm_pins, H200, 2026-11-30) found no reason to: 8
  // are admissible for the H3 shapes, and one algorithm's rate varied by up to 17 %
  // from one process to the next (fc1: 699-821 TFLOP/s), more than the candidates
  // differ (docs/cuda.md).
  int pick = 0;
  const char* why = "heuristic's first";
  if (const int forced = candidate_override(ctx.numerics, key.K); forced >= 0) {
    pick = std::min<int>(forced, static_cast<int>(admissible.size()) - 1);
    why = "numerics gemm_candidate";
  }
  const int i = admissible[static_cast<size_t>(pick)];
  plan.ok = true;
  plan.algo = res[i].algo;
  plan.workspace = res[i].workspaceSize;
  plan.desc = describe_algo(res[i].algo, res[i].workspaceSize);
  if (ctx.diagnostics.gemm_verbose)
    std::fprintf(stderr, "gemm pin: K %lld x%d w%d out%d bias%d align %d -> candidate %d of %zu (%s): %s\n",
                 static_cast<long long>(key.K), key.xt, key.wt, key.ot, key.bt, key.align, pick,
                 admissible.size(), why, plan.desc.c_str());
  return plan;
}

// ---- f32 x, bf16 w: plain SIMT kernel ---------------------------------------------
constexpr int kTile = 64, kTileK = 16;

// x: f32 [M, K]; w: bf16 [N, K]; bias: f32|bf16 [N] or null; out: f32|bf16 [M, N].
// 256 threads, each 4x4 outputs of a 64x64 tile; acc = fmaf over k ascending.
__global__ void __launch_bounds__(256) gemm_f32_bf16w(const float* __restrict__ x, int64_t ldx,
                                                      const uint16_t* __restrict__ w, int64_t ldw,
                                                      const void* bias, bool bias_f32, void* out, int64_t ldo,
                                                      bool out_f32, int64_t M, int64_t N, int64_t K) {
  __shared__ float xs[kTileK][kTile + 1];
  __shared__ float ws[kTileK][kTile + 1];
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTile, n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    for (int i = threadIdx.x; i < kTile * kTileK; i += 256) {
      const int r = i / kTileK, kk = i % kTileK;
      const int64_t k = k0 + kk;
      xs[kk][r] = (m0 + r < M && k < K) ? x[(m0 + r) * ldx + k] : 0.0f;
      ws[kk][r] = (n0 + r < N && k < K) ? bf16_bits_to_f32(w[(n0 + r) * ldw + k]) : 0.0f;
    }
    __syncthreads();
    const int kn = static_cast<int>(K - k0 < kTileK ? K - k0 : kTileK);
    for (int kk = 0; kk < kn; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = xs[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = ws[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + ty * 4 + i;
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t n = n0 + tx * 4 + j;
      if (n >= N) continue;
      float v = acc[i][j];
      if (bias) v = v + load_bf16_or_f32(bias, bias_f32, n);
      if (out_f32) static_cast<float*>(out)[m * ldo + n] = v;
      else static_cast<uint16_t*>(out)[m * ldo + n] = f32_to_bf16_bits(v);
    }
  }
}

// ---- f32 x (f32 | bf16) w in the CPU reference's 16-lane order --------------------
__device__ __forceinline__ float widen_w(float v) { return v; }
__device__ __forceinline__ float widen_w(uint16_t v) { return bf16_bits_to_f32(v); }

constexpr int kLaneTile = 4;  // outputs per half-warp: kLaneTile rows x kLaneTile columns

// 256 threads = 16 half-warps in a 4 x 4 grid; a CTA covers 16 rows x 16 columns. Lane
// l of a half-warp owns k = l (mod 16) of its 4 x 4 outputs (16 register sums), so a
// half-warp reads 16 consecutive floats of a row per step (coalesced). The 16 lane
// sums of an output are then added by shuffles within the half-warp in the CPU's tree
// order; lane 0 adds the bias and stores. An output's arithmetic depends on K only.
template <typename WT>
__global__ void __launch_bounds__(256) gemm_f32_lanes16(const float* __restrict__ x, int64_t ldx,
                                                        const WT* __restrict__ w, int64_t ldw, const void* bias,
                                                        bool bias_f32, void* out, int64_t ldo, bool out_f32,
                                                        int64_t M, int64_t N, int64_t K) {
  const int l = threadIdx.x % 16, hw = threadIdx.x / 16;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * 16 + (hw / 4) * kLaneTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * 16 + (hw % 4) * kLaneTile;
  // Rows/columns past the end read row 0 (valid memory); their sums are never stored.
  const float* xr[kLaneTile];
  const WT* wr[kLaneTile];
#pragma unroll
  for (int r = 0; r < kLaneTile; ++r) xr[r] = x + (m0 + r < M ? m0 + r : 0) * ldx;
#pragma unroll
  for (int c = 0; c < kLaneTile; ++c) wr[c] = w + (n0 + c < N ? n0 + c : 0) * ldw;
  float acc[kLaneTile][kLaneTile];
#pragma unroll
  for (int r = 0; r < kLaneTile; ++r)
#pragma unroll
    for (int c = 0; c < kLaneTile; ++c) acc[r][c] = 0.0f;
  for (int64_t k = l; k - l < K; k += 16) {
    const bool kv = k < K;  // the zero-padded tail adds fl32(0 * 0) = +0, as the CPU does
    float xv[kLaneTile], wv[kLaneTile];
#pragma unroll
    for (int r = 0; r < kLaneTile; ++r) xv[r] = kv ? xr[r][k] : 0.0f;
#pragma unroll
    for (int c = 0; c < kLaneTile; ++c) wv[c] = kv ? widen_w(wr[c][k]) : 0.0f;
#pragma unroll
    for (int r = 0; r < kLaneTile; ++r)
#pragma unroll
      for (int c = 0; c < kLaneTile; ++c) acc[r][c] = __fadd_rn(acc[r][c], __fmul_rn(xv[r], wv[c]));
  }
#pragma unroll
  for (int r = 0; r < kLaneTile; ++r) {
#pragma unroll
    for (int c = 0; c < kLaneTile; ++c) {
      // Lane l < 8: acc[l] + acc[l + 8]; l < 4: + s8[l + 4]; l < 2: + s4[l + 2]; l = 0: + s2[1].
      float v = acc[r][c];
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 8, 16));
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 4, 16));
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 2, 16));
      v = __fadd_rn(v, __shfl_down_sync(0xffffffffu, v, 1, 16));
      const int64_t m = m0 + r, n = n0 + c;
      if (l != 0 || m >= M || n >= N) continue;
      // The CPU adds +0 when there is no bias (turning a -0 sum into +0): same here.
      v = __fadd_rn(v, bias ? load_bf16_or_f32(bias, bias_f32, n) : 0.0f);
      if (out_f32) static_cast<float*>(out)[m * ldo + n] = v;
      else static_cast<uint16_t*>(out)[m * ldo + n] = f32_to_bf16_bits(v);
    }
  }
}

// The default for f32 x (f32|bf16) since the H200 check (GoldenOps.Gemm/cuda: bytes and
// errors equal the CPU reference's; CudaOps.Gemm* pass); Numerics::gemm_f32 = cublaslt
// selects the pinned cuBLASLt / plain SIMT path instead.
bool gemm_f32_lanes16_selected(const CudaContext& ctx) { return ctx.numerics.gemm_f32 == GemmF32Order::lanes16; }

Status launch_gemm_f32_lanes16(CudaContext& ctx, const TensorView& x, const TensorView& w, const TensorView* bias,
                               const TensorView& out) {
  const int64_t M = x.shape[0], N = w.shape[0], K = x.shape[1];
  if (div_up(N, 16) >= 65536) return unsupported("gemm", "N = " + std::to_string(N) + " too large for the lanes16 kernel");
  dim3 grid(static_cast<unsigned>(div_up(M, 16)), static_cast<unsigned>(div_up(N, 16)));
  const void* b = bias ? bias->data : nullptr;
  const bool bf32 = bias && bias->dtype == DType::f32, of32 = out.dtype == DType::f32;
  if (w.dtype == DType::f32)
    gemm_f32_lanes16<float><<<grid, 256, 0, ctx.stream>>>(x.ptr<const float>(), x.stride[0], w.ptr<const float>(),
                                                           w.stride[0], b, bf32, out.data, out.stride[0], of32, M, N, K);
  else
    gemm_f32_lanes16<uint16_t><<<grid, 256, 0, ctx.stream>>>(x.ptr<const float>(), x.stride[0],
                                                              w.ptr<const uint16_t>(), w.stride[0], b, bf32, out.data,
                                                              out.stride[0], of32, M, N, K);
  LS_CUDA_CHECK_LAUNCH();
  return Status();
}

// out[m, n] = round(stage[m, n] + bias[n]): stage f32 [M, ldst]; bias f32|bf16 [N]; out f32|bf16 [M, N].
__global__ void bias_add_round(const float* __restrict__ stage, int64_t ldst, const void* bias, bool bias_f32,
                               void* out, int64_t ldo, bool out_f32, int64_t N) {
  const int64_t m = blockIdx.x;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const float v = stage[m * ldst + n] + load_bf16_or_f32(bias, bias_f32, n);
    if (out_f32) static_cast<float*>(out)[m * ldo + n] = v;
    else static_cast<uint16_t*>(out)[m * ldo + n] = f32_to_bf16_bits(v);
  }
}

bool gemm_shapes_ok(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& out) {
  return x.ndim == 2 && w.ndim == 2 && out.ndim == 2 && x.shape[1] == w.shape[1] && out.shape[0] == x.shape[0] &&
         out.shape[1] == w.shape[0] && x.inner_contiguous() && w.inner_contiguous() && out.inner_contiguous() &&
         (!bias || (bias->ndim == 1 && bias->shape[0] == w.shape[0] && bias->inner_contiguous()));
}

GemmKey make_key(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& out) {
  const int align = std::min<int>({align_of(x.data, x.stride[0] * x.elem_size()), align_of(w.data, w.stride[0] * w.elem_size()),
                              align_of(out.data, out.stride[0] * out.elem_size()),
                              bias ? align_of(bias->data, 0) : 16});
  return GemmKey{static_cast<int>(x.dtype), static_cast<int>(w.dtype), static_cast<int>(out.dtype),
                 bias ? static_cast<int>(bias->dtype) : -1, x.shape[1], align};
}

const GemmPlan& plan_for(CudaContext& ctx, const GemmKey& key) {
  std::lock_guard<std::mutex> lock(ctx.gemm_cache->mu);
  auto it = ctx.gemm_cache->plans.find(key);
  if (it == ctx.gemm_cache->plans.end()) it = ctx.gemm_cache->plans.emplace(key, choose_plan(ctx, key)).first;
  return it->second;
}

}  // namespace

std::string gemm_describe_pinned(CudaContext& ctx, const TensorView& x, const TensorView& w, const TensorView* bias,
                                 const TensorView& out) {
  if (!gemm_shapes_ok(x, w, bias, out)) return "bad shapes";
  if (x.dtype == DType::f32 && gemm_f32_lanes16_selected(ctx)) return "simt f32 lanes16 (the CPU reference's order)";
  if (x.dtype == DType::f32 && w.dtype == DType::bf16) return "simt f32 x bf16 (fmaf, k ascending)";
  const GemmPlan& p = plan_for(ctx, make_key(x, w, bias, out));
  if (!p.ok && bias) {
    TensorView st = out;
    st.dtype = DType::f32;
    st.stride[0] = (out.shape[1] + 3) / 4 * 4;
    st.data = ctx.workspace;
    return "staged bias: " + gemm_describe_pinned(ctx, x, w, nullptr, st);
  }
  return p.ok ? p.desc : p.error;
}

Status cuda_op_gemm(CudaContext& ctx, const TensorView& x, const TensorView& w, const TensorView* bias,
                    const TensorView& out) {
  LS_CHECK_MSG(gemm_shapes_ok(x, w, bias, out), "gemm: x " + x.shape_str() + " w " + w.shape_str() + " out " +
                                                    out.shape_str() + (bias ? " bias " + bias->shape_str() : ""));
  const int64_t M = x.shape[0], N = w.shape[0], K = x.shape[1];
  const bool bias_ok = !bias || bias->dtype == DType::f32 || bias->dtype == DType::bf16;
  const bool out_ok = out.dtype == DType::f32 || out.dtype == DType::bf16;
  const bool lt_types = (x.dtype == DType::bf16 && w.dtype == DType::bf16) ||
                        (x.dtype == DType::f32 && w.dtype == DType::f32 && out.dtype == DType::f32);
  const bool mixed = x.dtype == DType::f32 && w.dtype == DType::bf16;
  if (!bias_ok || !out_ok || !(lt_types || mixed))
    return unsupported("gemm", "x " + x.shape_str() + " w " + w.shape_str() + " out " + out.shape_str() +
                                   (bias ? " bias " + bias->shape_str() : ""));
  if (M == 0 || N == 0) return Status();
  if (x.dtype == DType::f32 && gemm_f32_lanes16_selected(ctx)) return launch_gemm_f32_lanes16(ctx, x, w, bias, out);
  if (mixed) {
    dim3 grid(static_cast<unsigned>(div_up(N, kTile)), static_cast<unsigned>(div_up(M, kTile)));
    LS_CHECK_MSG(div_up(M, kTile) < 65536, "gemm f32 x bf16: M too large for one launch");
    gemm_f32_bf16w<<<grid, 256, 0, ctx.stream>>>(x.ptr<const float>(), x.stride[0], w.ptr<const uint16_t>(),
                                                 w.stride[0], bias ? bias->data : nullptr,
                                                 bias && bias->dtype == DType::f32, out.data, out.stride[0],
                                                 out.dtype == DType::f32, M, N, K);
    LS_CUDA_CHECK_LAUNCH();
    return Status();
  }
  if (ctx.workspace_bytes < gemm_workspace_bytes())
    return make_error(ErrorCode::invalid_argument,
                      "cuda gemm: no workspace; call Backend::set_workspace with workspace_bytes() = " +
                          std::to_string(gemm_workspace_bytes()) + " bytes from the device arena first");
  const GemmKey key = make_key(x, w, bias, out);
  const GemmPlan& plan = plan_for(ctx, key);
  if (!plan.ok && bias) {
    // Staged bias: pinned f32-output GEMM without bias, row chunk by row chunk.
    const int64_t ldst = (N + 3) / 4 * 4;  // 16-byte rows, so the key's alignment depends on x, w only
    const int64_t rows_per = static_cast<int64_t>(kGemmStageBytes / (static_cast<size_t>(ldst) * 4));
    if (rows_per == 0) return unsupported("gemm", "N too large for the staged bias path");
    float* stage = reinterpret_cast<float*>(static_cast<char*>(ctx.workspace) + kGemmWorkspaceBytes);
    for (int64_t m0 = 0; m0 < M; m0 += rows_per) {
      const int64_t m1 = std::min(M, m0 + rows_per);
      TensorView st(stage, DType::f32, {m1 - m0, N}, out.device);
      st.stride[0] = ldst;
      LS_TRY(cuda_op_gemm(ctx, x.slice_rows(m0, m1), w, nullptr, st));
      TensorView o = out.slice_rows(m0, m1);
      bias_add_round<<<static_cast<unsigned>(m1 - m0), 256, 0, ctx.stream>>>(
          stage, ldst, bias->data, bias->dtype == DType::f32, o.data, o.stride[0], o.dtype == DType::f32, N);
      LS_CUDA_CHECK_LAUNCH();
    }
    return Status();
  }
  if (!plan.ok)
    return unsupported("gemm", plan.error + " for x " + x.shape_str() + " w " + w.shape_str() + " out " +
                                   out.shape_str());
  LtDescs d;
  cublasStatus_t s = make_descs(d, x.dtype, w.dtype, out.dtype, key.bt, bias ? bias->data : nullptr, M, N, K,
                                x.stride[0], w.stride[0], out.stride[0]);
  if (s != CUBLAS_STATUS_SUCCESS) return cublas_error(s, "gemm descriptors");
  const float alpha = 1.0f, beta = 0.0f;
  s = cublasLtMatmul(ctx.lt, d.op, &alpha, w.data, d.a, x.data, d.b, &beta, out.data, d.c, out.data, d.c, &plan.algo,
                     ctx.workspace, kGemmWorkspaceBytes, ctx.stream);
  if (s != CUBLAS_STATUS_SUCCESS)
    return cublas_error(s, "cublasLtMatmul (" + plan.desc + ") x " + x.shape_str() + " w " + w.shape_str());
  return Status();
}

}  // namespace ls::cuda
