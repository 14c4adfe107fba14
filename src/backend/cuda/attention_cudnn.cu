// The cuDNN attention path: cuDNN 9's fused flash-attention forward (built with the
// backend descriptor API, no cudnn_frontend: the unified SDPA_FWD operation, else the
// composite matmul/softmax/matmul graph) once per key tile, tiles merged in fp32.
//
// Per chunk of kQChunk queries (a FIXED row count: every cuDNN call sees the same
// graph whatever Mq is, which is what makes the path query-slice invariant) and per
// key tile T = [t0, t1) of kv_tile keys, in order:
//   cuDNN:  O_t   = bf16( softmax(scale * Q K_T^T) V_T )        bf16 [Qc, H, Dh]
//           LSE_t = max_j s_j + log(sum_j exp(s_j - max))       fp32 [H, Qc]
//   merge (fp32, per (query, head), tiles in order; state L = -inf, acc = 0):
//     first tile with finite LSE_t: L = LSE_t, acc = fl32(O_t)
//     later tiles: m = max(L, LSE_t); a = exp(L - m); b = exp(LSE_t - m); s = a + b
//                  acc = fma(O_t, b / s, acc * (a / s)); L = m + log(s)
//     a tile with LSE_t = -inf (no finite score) contributes nothing
//   out = bf16(acc)                                              (one rounding)
// So the rounding points differ from the native kernel's contract (backend.h): each
// tile's output is rounded to bf16 by cuDNN before the merge, and the softmax
// normalisation happens per tile (inside cuDNN) and again in the merge, not once at the
// end. The error stays within 2x of the plain bf16 reference (tested); the bits differ
// from the native kernel and may change with kv_tile, the cuDNN version and the engine
// cuDNN's heuristic picks (cached per graph for the process). Query slicing never
// changes them: queries are staged into a zero-padded [kQChunk, H, Dh] buffer, so the
// graph (and engine) is the same for every chunk, and a row's arithmetic inside the
// flash kernel and the merge depends only on that row.
//
// Memory: all scratch comes from the caller's workspace (Backend::set_workspace),
// sized by attention_cudnn_workspace_bytes(H, Dh); a smaller workspace is a clear
// Status, never an allocation. cuDNN's handle (one per device, created on first use)
// and its plan cache live for the process.
#include "backend/cuda/attention_cudnn.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

#ifdef LAYERSTREAM_CUDNN
#include <cudnn.h>
#endif

namespace ls::cuda {
namespace {

constexpr int64_t kQChunk = 2048;       // queries per cuDNN call (fixed: part of the numerics)
constexpr int64_t kTilesPerMerge = 4;   // key tiles per merge launch (speed only: same bits)
constexpr size_t kCudnnReserve = 64ull << 20;  // cuDNN's own workspace, at most
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Workspace layout (each piece 256-byte aligned), for H heads of Dh:
//   Qs   bf16 [Qc, H, Dh]          staged query chunk (rows >= n zero)
//   Ot   bf16 [G][Qc, H, Dh]       per-tile outputs of one merge group
//   Lt   f32  [G][H, Qc]           per-tile LSE (cuDNN's stats layout)
//   acc  f32  [Qc, H, Dh]          merge state between groups
//   L    f32  [Qc, H]
//   ws   cuDNN workspace (kCudnnReserve)
struct Layout {
  size_t qs, ot, lt, acc, l, ws, total;
  size_t ot_stride, lt_stride;
};
Layout layout(int64_t H, int64_t Dh) {
  Layout y{};
  const size_t rows = static_cast<size_t>(kQChunk * H);
  const size_t tile_bf16 = align_up(rows * static_cast<size_t>(Dh) * 2);
  const size_t tile_lse = align_up(rows * 4);
  y.ot_stride = tile_bf16;
  y.lt_stride = tile_lse;
  y.qs = 0;
  y.ot = y.qs + tile_bf16;
  y.lt = y.ot + kTilesPerMerge * tile_bf16;
  y.acc = y.lt + kTilesPerMerge * tile_lse;
  y.l = y.acc + align_up(rows * static_cast<size_t>(Dh) * 4);
  y.ws = y.l + tile_lse;
  y.total = y.ws + kCudnnReserve;
  return y;
}

// Qs[r, h, :] = q[c0 + r, h, :] for r < n, zeros for n <= r < Qc. One thread per 8 elements.
__global__ void stage_queries(const uint16_t* __restrict__ q, int64_t sq, int64_t hq, int64_t c0, int64_t n,
                              uint16_t* __restrict__ qs, int H, int Dh) {
  const int64_t chunks = Dh / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kQChunk * H * chunks) return;
  const int64_t c = i % chunks, h = (i / chunks) % H, r = i / (chunks * H);
  uint4 v = make_uint4(0, 0, 0, 0);
  if (r < n) v = *reinterpret_cast<const uint4*>(q + (c0 + r) * sq + h * hq + c * 8);
  *reinterpret_cast<uint4*>(qs + (r * H + h) * Dh + c * 8) = v;
}

struct MergeArgs {
  const uint16_t* ot;  // bf16 [G][Qc, H, Dh], tile stride ot_stride elements
  const float* lt;     // f32 [G][H, Qc], tile stride lt_stride elements
  int64_t ot_stride, lt_stride;
  int ntiles;          // tiles in this group
  bool first, last;    // first group: no state to load; last group: write out
  float* acc;          // f32 [Qc, H, Dh]
  float* l;            // f32 [Qc, H]
  uint16_t* out;       // bf16 rows [c0, c0 + n) of the caller's output
  int64_t so, ho;
  int64_t n;           // valid rows in this chunk
  int H, Dh;
};

// One thread per (row, head, 8 dims). The rule (file comment) per (row, head) uses only
// that row's tiles, in tile order, so its bits do not depend on the launch shape or on
// kTilesPerMerge (the fp32 state round-trips through memory exactly).
__global__ void merge_tiles(const MergeArgs a) {
  const int64_t chunks = a.Dh / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n * a.H * chunks) return;
  const int64_t c = i % chunks, h = (i / chunks) % a.H, r = i / (chunks * a.H);
  const int64_t rh = r * a.H + h;
  float L = -INFINITY, acc[8];
  if (a.first) {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
  } else {
    L = a.l[rh];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = a.acc[rh * a.Dh + c * 8 + e];
  }
  for (int t = 0; t < a.ntiles; ++t) {
    const float lse = a.lt[t * a.lt_stride + h * kQChunk + r];
    float o[8];
    load8_bf16(a.ot + t * a.ot_stride + rh * a.Dh + c * 8, true, 8, o);
    if (lse == -INFINITY) continue;  // no finite score in this tile: weight 0
    if (L == -INFINITY) {
      L = lse;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = o[e];
      continue;
    }
    const float m = fmaxf(L, lse);
    const float ea = expf(L - m), eb = expf(lse - m);
    const float s = ea + eb;
    const float wa = ea / s, wb = eb / s;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = fmaf(o[e], wb, acc[e] * wa);
    L = m + logf(s);
  }
  if (a.last) {
    store8_bf16(a.out + r * a.so + h * a.ho + c * 8, true, 8, acc);
  } else {
    if (c == 0) a.l[rh] = L;
#pragma unroll
    for (int e = 0; e < 8; ++e) a.acc[rh * a.Dh + c * 8 + e] = acc[e];
  }
}

#ifdef LAYERSTREAM_CUDNN

constexpr int kMaxDevices = 64;
constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidStats = 5, kUidScale = 6;

Error cudnn_error(cudnnStatus_t s, const std::string& what) {
  char last[512] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  return make_error(ErrorCode::device, "cudnn attention: " + what + ": " + cudnnGetErrorString(s) +
                                           (last[0] ? std::string(" (") + last + ")" : std::string()));
}

// Builds backend descriptors, remembering the first failure (later calls do nothing)
// and every descriptor it made (kept alive with the plan).
struct Builder {
  std::vector<cudnnBackendDescriptor_t> made;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  std::string failed_at;

  bool ok() const { return status == CUDNN_STATUS_SUCCESS; }
  void note(cudnnStatus_t s, const char* what) {
    if (s != CUDNN_STATUS_SUCCESS && ok()) status = s, failed_at = what;
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = nullptr;
    if (!ok()) return nullptr;
    note(cudnnBackendCreateDescriptor(t, &d), "create descriptor");
    if (d) made.push_back(d);
    return d;
  }
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t count,
           const void* v, const char* what) {
    if (ok()) note(cudnnBackendSetAttribute(d, n, t, count, v), what);
  }
  void finalize(cudnnBackendDescriptor_t d, const char* what) {
    if (ok()) note(cudnnBackendFinalize(d), what);
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendDescriptor_t v,
                const char* what) {
    set(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
  }

  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const int64_t dims[4], const int64_t strides[4],
                                  bool is_virtual, bool by_value = false) {
    cudnnBackendDescriptor_t d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims");
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value) set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    finalize(d, "tensor");
    return d;
  }
  cudnnBackendDescriptor_t matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t m = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(m, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "matmul compute type");
    finalize(m, "matmul descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul A");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, "matmul B");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul C");
    set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m, "matmul desc");
    finalize(op, "matmul operation");
    return op;
  }
  cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                     cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f, "pointwise precision");
    finalize(pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise desc");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise X");
    if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise B");
    set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise Y");
    finalize(op, "pointwise operation");
    return op;
  }
  cudnnBackendDescriptor_t reduction(cudnnReduceTensorOp_t r, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r, "reduction operator");
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f, "reduction compute type");
    finalize(rd, "reduction descriptor");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction X");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction Y");
    set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "reduction desc");
    finalize(op, "reduction operation");
    return op;
  }
};

struct Plan {
  std::vector<cudnnBackendDescriptor_t> keep;  // never destroyed (process lifetime)
  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;
  std::string engine;  // for messages
};

// Graph key: everything the descriptors depend on. Mq is not in it (fixed chunk).
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t>;

std::mutex g_mu;
cudnnHandle_t g_handles[kMaxDevices] = {};
std::map<PlanKey, Plan*> g_plans;

Expected<cudnnHandle_t> handle_for(int device) {
  LS_CHECK(device >= 0 && device < kMaxDevices);
  if (!g_handles[device]) {
    cudnnStatus_t s = cudnnCreate(&g_handles[device]);
    if (s != CUDNN_STATUS_SUCCESS) return cudnn_error(s, "cudnnCreate");
  }
  return g_handles[device];
}

// The SDPA forward graph for one key tile of kv keys. Composite form (the pattern
// cuDNN's fused flash-attention engine recognises in cudnn_frontend's expansion):
//   S = Q K^T (fp32) -> S * scale -> M = max_j -> E = exp(S - M) -> Z = sum_j E
//   -> Stats = M + log Z (LSE, fp32 out) -> P = E / Z -> O = P V (bf16 out)
// Unified form (cuDNN >= 9.x): the same computation as one SDPA_FWD operation.
// Q, O: our staged [Qc, H, Dh] chunk; K, V: the caller's strided views.
// Two ways to say SDPA forward to cuDNN, tried in this order:
//   unified:   one CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR (Q, K, V, O, Stats, Scale);
//   composite: the ten-op graph above (what cudnn_frontend emits for cuDNN < 9.21).
enum class GraphForm { unified, composite };

Expected<Plan*> build_plan_form(GraphForm form, cudnnHandle_t handle, int64_t H, int64_t Dh, int64_t kv, int64_t sk,
                                int64_t hk, int64_t sv, int64_t hv) {
  Builder b;
  const int64_t Qc = kQChunk;
  const int64_t q_dims[4] = {1, H, Qc, Dh}, q_str[4] = {Qc * H * Dh, Dh, H * Dh, 1};
  const int64_t kt_dims[4] = {1, H, Dh, kv}, kt_str[4] = {kv * sk, hk, 1, sk};
  const int64_t v_dims[4] = {1, H, kv, Dh}, v_str[4] = {kv * sv, hv, sv, 1};
  const int64_t s_dims[4] = {1, H, Qc, kv}, s_str[4] = {H * Qc * kv, Qc * kv, kv, 1};
  const int64_t r_dims[4] = {1, H, Qc, 1}, r_str[4] = {H * Qc, Qc, 1, 1};
  const int64_t one[4] = {1, 1, 1, 1};
  const int64_t k_dims[4] = {1, H, kv, Dh}, k_str[4] = {kv * sk, hk, sk, 1};
  auto Q = b.tensor(kUidQ, CUDNN_DATA_BFLOAT16, q_dims, q_str, false);
  auto V = b.tensor(kUidV, CUDNN_DATA_BFLOAT16, v_dims, v_str, false);
  auto O = b.tensor(kUidO, CUDNN_DATA_BFLOAT16, q_dims, q_str, false);
  auto Stats = b.tensor(kUidStats, CUDNN_DATA_FLOAT, r_dims, r_str, false);
  auto Scale = b.tensor(kUidScale, CUDNN_DATA_FLOAT, one, one, false, true);
  std::vector<cudnnBackendDescriptor_t> ops;
  if (form == GraphForm::unified) {
    auto K = b.tensor(kUidK, CUDNN_DATA_BFLOAT16, k_dims, k_str, false);
    auto op = b.make(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, Q, "sdpa Q");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, K, "sdpa K");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, V, "sdpa V");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, O, "sdpa O");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, Stats, "sdpa stats");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, Scale, "sdpa scale");
    b.finalize(op, "sdpa operation");
    ops.push_back(op);
  } else {
    auto K = b.tensor(kUidK, CUDNN_DATA_BFLOAT16, kt_dims, kt_str, false);  // K^T view of the same memory
    auto S = b.tensor(101, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    auto Ss = b.tensor(102, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    auto M = b.tensor(103, CUDNN_DATA_FLOAT, r_dims, r_str, true);
    auto D = b.tensor(104, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    auto E = b.tensor(105, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    auto Z = b.tensor(106, CUDNN_DATA_FLOAT, r_dims, r_str, true);
    auto LZ = b.tensor(107, CUDNN_DATA_FLOAT, r_dims, r_str, true);
    auto P = b.tensor(108, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    ops = {
        b.matmul(Q, K, S),
        b.pointwise(CUDNN_POINTWISE_MUL, S, Scale, Ss),
        b.reduction(CUDNN_REDUCE_TENSOR_MAX, Ss, M),
        b.pointwise(CUDNN_POINTWISE_SUB, Ss, M, D),
        b.pointwise(CUDNN_POINTWISE_EXP, D, nullptr, E),
        b.reduction(CUDNN_REDUCE_TENSOR_ADD, E, Z),
        b.pointwise(CUDNN_POINTWISE_LOG, Z, nullptr, LZ),
        b.pointwise(CUDNN_POINTWISE_ADD, M, LZ, Stats),
        b.pointwise(CUDNN_POINTWISE_DIV, E, Z, P),
        b.matmul(P, V, O),
    };
  }
  auto graph = b.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
        ops.data(), "graph ops");
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
  b.finalize(graph, "operation graph");
  if (!b.ok()) return cudnn_error(b.status, "building the SDPA graph (" + b.failed_at + ")");
  // Engine configs in heuristic order (mode A, then the fallback list); the first whose
  // plan finalizes and whose workspace fits the reserve stays pinned for this graph for
  // the life of the process.
  std::string why;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Builder hb;
    auto heur = hb.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    hb.set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
    hb.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    hb.finalize(heur, "heuristics");
    int64_t n = 0;
    if (hb.ok())
      hb.note(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n,
                                       nullptr),
              "counting engine configs");
    std::vector<cudnnBackendDescriptor_t> cfgs(static_cast<size_t>(std::max<int64_t>(n, 0)));
    for (auto& c : cfgs) c = hb.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    if (hb.ok() && n > 0)
      hb.note(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got,
                                       cfgs.data()),
              "reading engine configs");
    if (!hb.ok()) {
      why += std::string(" heuristics mode ") + std::to_string(static_cast<int>(mode)) + ": " + hb.failed_at + " " +
             cudnnGetErrorString(hb.status) + ";";
      continue;
    }
    for (int64_t i = 0; i < got; ++i) {
      cudnnBackendDescriptor_t plan = nullptr;
      if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
        continue;
      cudnnStatus_t ps = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                                  CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[static_cast<size_t>(i)]);
      if (ps == CUDNN_STATUS_SUCCESS)
        ps = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      if (ps == CUDNN_STATUS_SUCCESS) ps = cudnnBackendFinalize(plan);
      int64_t ws = 0, cnt = 0;
      if (ps == CUDNN_STATUS_SUCCESS)
        ps = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws);
      if (ps != CUDNN_STATUS_SUCCESS || static_cast<size_t>(ws) > kCudnnReserve) {
        why += " mode " + std::to_string(static_cast<int>(mode)) + " cfg " + std::to_string(i) + ": " +
               (ps != CUDNN_STATUS_SUCCESS ? std::string(cudnnGetErrorString(ps))
                                           : "workspace " + std::to_string(ws) + " bytes") +
               ";";
        cudnnBackendDestroyDescriptor(plan);
        continue;
      }
      // The engine's global index, for messages and LAYERSTREAM_CUDNN_VERBOSE.
      int64_t engine_index = -1;
      {
        cudnnBackendDescriptor_t eng = nullptr;
        int64_t c1 = 0;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
          if (cudnnBackendGetAttribute(cfgs[static_cast<size_t>(i)], CUDNN_ATTR_ENGINECFG_ENGINE,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c1, &eng) == CUDNN_STATUS_SUCCESS)
            cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &c1, &engine_index);
          cudnnBackendDestroyDescriptor(eng);
        }
      }
      auto* p = new Plan;
      p->keep = std::move(b.made);
      p->keep.insert(p->keep.end(), hb.made.begin(), hb.made.end());
      p->plan = plan;
      p->workspace = ws;
      p->engine = std::string(form == GraphForm::unified ? "unified SDPA op" : "composite graph") + ", engine " +
                  std::to_string(engine_index) + " (heuristic mode " +
                  std::to_string(static_cast<int>(mode)) + " config " + std::to_string(i) + ")";
      if (std::getenv("LAYERSTREAM_CUDNN_VERBOSE"))
        std::fprintf(stderr, "cudnn attention: H=%lld Dh=%lld kv=%lld -> %s, workspace %lld bytes\n",
                     static_cast<long long>(H), static_cast<long long>(Dh), static_cast<long long>(kv),
                     p->engine.c_str(), static_cast<long long>(ws));
      return p;
    }
  }
  return make_error(ErrorCode::unsupported,
                    "cudnn attention: no engine config gave a usable plan for the SDPA graph:" + why);
}

Expected<Plan*> build_plan(cudnnHandle_t handle, int64_t H, int64_t Dh, int64_t kv, int64_t sk, int64_t hk, int64_t sv,
                           int64_t hv) {
  auto unified = build_plan_form(GraphForm::unified, handle, H, Dh, kv, sk, hk, sv, hv);
  if (unified.ok()) return unified;
  auto composite = build_plan_form(GraphForm::composite, handle, H, Dh, kv, sk, hk, sv, hv);
  if (composite.ok()) return composite;
  return make_error(ErrorCode::unsupported, "unified SDPA op: " + unified.error().message +
                                                " | composite graph: " + composite.error().message +
                                                " (run with CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr for "
                                                "cuDNN's reasons; unset LAYERSTREAM_ATTENTION for the native kernel)");
}

Status run_tile(cudnnHandle_t handle, const Plan& plan, void* qs, const void* k, const void* v, void* o, void* stats,
                float scale, void* ws) {
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (s != CUDNN_STATUS_SUCCESS) return cudnn_error(s, "variant pack");
  const int64_t uids[6] = {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale};
  void* ptrs[6] = {qs, const_cast<void*>(k), const_cast<void*>(v), o, stats, &scale};
  s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 6, uids);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 6, ptrs);
  if (s == CUDNN_STATUS_SUCCESS)
    s = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(pack);
  if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(handle, plan.plan, pack);
  cudnnBackendDestroyDescriptor(pack);
  if (s != CUDNN_STATUS_SUCCESS) return cudnn_error(s, "execute (" + plan.engine + ")");
  return Status();
}

#endif  // LAYERSTREAM_CUDNN

}  // namespace

bool attention_cudnn_selected() {
  const char* e = std::getenv("LAYERSTREAM_ATTENTION");
  return e != nullptr && std::strcmp(e, "cudnn") == 0;
}

size_t attention_cudnn_workspace_bytes(int64_t H, int64_t Dh) { return layout(H, Dh).total; }

Status attention_cudnn(CudaContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const AttentionParams& p) {
#ifndef LAYERSTREAM_CUDNN
  (void)ctx, (void)q, (void)k, (void)v, (void)out, (void)p;
  return unsupported("attention", "LAYERSTREAM_ATTENTION=cudnn but this build has no cuDNN; unset it for the "
                                  "native kernel");
#else
  LS_CHECK_MSG(q.ndim == 3 && k.ndim == 3 && v.ndim == 3 && out.ndim == 3 && k.shape[0] == v.shape[0] &&
                   q.shape[1] == k.shape[1] && q.shape[1] == v.shape[1] && q.shape[1] == out.shape[1] &&
                   q.shape[2] == k.shape[2] && q.shape[2] == v.shape[2] && q.shape[2] == out.shape[2] &&
                   q.shape[0] == out.shape[0] && q.inner_contiguous() && k.inner_contiguous() &&
                   v.inner_contiguous() && out.inner_contiguous() && p.kv_tile > 0,
               "attention (cudnn): q " + q.shape_str() + " k " + k.shape_str() + " v " + v.shape_str() + " out " +
                   out.shape_str());
  if (q.dtype != DType::bf16 || k.dtype != DType::bf16 || v.dtype != DType::bf16 || out.dtype != DType::bf16)
    return unsupported("attention (cudnn)", "needs bf16 q, k, v, out");
  const int64_t Mq = q.shape[0], Mk = k.shape[0], H = q.shape[1], Dh = q.shape[2];
  if (Dh % 8 != 0 || Dh > 256)
    return unsupported("attention (cudnn)", "head_dim " + std::to_string(Dh) + " (needs a multiple of 8, <= 256)");
  bool aligned = true;
  for (const TensorView* t : {&q, &k, &v, &out})
    aligned = aligned && aligned16(t->data) && t->stride[0] % 8 == 0 && t->stride[1] % 8 == 0;
  if (!aligned)
    return unsupported("attention (cudnn)", "q, k, v, out need 16-byte aligned rows and heads (strides multiple of 8)");
  if (Mq == 0) return Status();
  if (Mk == 0) return unsupported("attention (cudnn)", "no keys");
  const Layout lay = layout(H, Dh);
  if (ctx.workspace == nullptr || ctx.workspace_bytes < lay.total)
    return make_error(ErrorCode::invalid_argument,
                      "cuda attention (cudnn): the backend workspace has " + std::to_string(ctx.workspace_bytes) +
                          " bytes, the cuDNN path needs " + std::to_string(lay.total) + " for H = " +
                          std::to_string(H) + ", head_dim = " + std::to_string(Dh) +
                          " (attention_cudnn_workspace_bytes); hand a larger view to set_workspace or unset "
                          "LAYERSTREAM_ATTENTION");
  const float scale = p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  if (!(scale > 0.0f)) return unsupported("attention (cudnn)", "softmax scale must be positive");
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &scale, 4);

  // Plans for the full tile length and (if any) the last, shorter tile.
  const int64_t ntiles = div_up(Mk, p.kv_tile);
  cudnnHandle_t handle;
  Plan* plan_full = nullptr;
  Plan* plan_last = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto h = handle_for(ctx.device);
    if (!h.ok()) return h.error();
    handle = h.value();
    auto get = [&](int64_t kv) -> Expected<Plan*> {
      const PlanKey key{ctx.device, H, Dh, kv, k.stride[0], k.stride[1], v.stride[0], v.stride[1], scale_bits};
      auto it = g_plans.find(key);
      if (it != g_plans.end()) return it->second;
      auto built = build_plan(handle, H, Dh, kv, k.stride[0], k.stride[1], v.stride[0], v.stride[1]);
      if (!built.ok()) return built.error();
      g_plans[key] = built.value();
      return built.value();
    };
    const int64_t full_len = std::min(p.kv_tile, Mk), last_len = Mk - (ntiles - 1) * p.kv_tile;
    auto pf = get(full_len);
    if (!pf.ok()) return pf.error();
    plan_full = pf.value();
    auto pl = get(last_len);
    if (!pl.ok()) return pl.error();
    plan_last = pl.value();
  }
  cudnnStatus_t ss = cudnnSetStream(handle, ctx.stream);
  if (ss != CUDNN_STATUS_SUCCESS) return cudnn_error(ss, "cudnnSetStream");

  uint8_t* ws = static_cast<uint8_t*>(ctx.workspace);
  uint16_t* qs = reinterpret_cast<uint16_t*>(ws + lay.qs);
  const auto* kb = k.ptr<const uint16_t>();
  const auto* vb = v.ptr<const uint16_t>();
  const int threads = 256;
  for (int64_t c0 = 0; c0 < Mq; c0 += kQChunk) {
    const int64_t n = std::min(kQChunk, Mq - c0);
    const int64_t stage_n = kQChunk * H * (Dh / 8);
    stage_queries<<<static_cast<unsigned>(div_up(stage_n, threads)), threads, 0, ctx.stream>>>(
        q.ptr<const uint16_t>(), q.stride[0], q.stride[1], c0, n, qs, static_cast<int>(H), static_cast<int>(Dh));
    LS_CUDA_CHECK_LAUNCH();
    for (int64_t g0 = 0; g0 < ntiles; g0 += kTilesPerMerge) {
      const int64_t gn = std::min(kTilesPerMerge, ntiles - g0);
      for (int64_t t = g0; t < g0 + gn; ++t) {
        const int64_t t0 = t * p.kv_tile;
        const Plan& plan = t == ntiles - 1 ? *plan_last : *plan_full;
        Status s = run_tile(handle, plan, qs, kb + t0 * k.stride[0], vb + t0 * v.stride[0],
                            ws + lay.ot + static_cast<size_t>(t - g0) * lay.ot_stride,
                            ws + lay.lt + static_cast<size_t>(t - g0) * lay.lt_stride, scale, ws + lay.ws);
        if (!s.ok()) return s;
      }
      MergeArgs a{};
      a.ot = reinterpret_cast<const uint16_t*>(ws + lay.ot);
      a.lt = reinterpret_cast<const float*>(ws + lay.lt);
      a.ot_stride = static_cast<int64_t>(lay.ot_stride / 2);
      a.lt_stride = static_cast<int64_t>(lay.lt_stride / 4);
      a.ntiles = static_cast<int>(gn);
      a.first = g0 == 0;
      a.last = g0 + gn == ntiles;
      a.acc = reinterpret_cast<float*>(ws + lay.acc);
      a.l = reinterpret_cast<float*>(ws + lay.l);
      a.out = out.ptr<uint16_t>() + c0 * out.stride[0];
      a.so = out.stride[0];
      a.ho = out.stride[1];
      a.n = n;
      a.H = static_cast<int>(H);
      a.Dh = static_cast<int>(Dh);
      const int64_t merge_n = n * H * (Dh / 8);
      merge_tiles<<<static_cast<unsigned>(div_up(merge_n, threads)), threads, 0, ctx.stream>>>(a);
      LS_CUDA_CHECK_LAUNCH();
    }
  }
  return Status();
#endif
}

}  // namespace ls::cuda
