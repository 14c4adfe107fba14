// The cuDNN attention path: cuDNN 9's fused flash-attention forward (built with the
// backend descriptor API, no cudnn_frontend: the unified SDPA_FWD operation, else the
// composite matmul/softmax/matmul graph) once per key tile, tiles merged in fp32.
//
// Per chunk of Qc queries (Numerics::cudnn_q_chunk, default 2048: a FIXED row count for
// the backend: every cuDNN call sees the same graph whatever Mq is, which is what makes
// the path query-slice invariant) and per
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
// changes them: queries are staged into a zero-padded [Qc, H, Dh] buffer, so the
// graph (and engine) is the same for every chunk, and a row's arithmetic inside the
// flash kernel and the merge depends only on that row.
//
// Streamed keys (AttentionParams::state): the merge state (acc, L) of every (query,
// head) is loaded from / saved to p.state, f32 [Mq, H, Dh + 8] laid out as acc[0, Dh)
// then L at [Dh] (private to this path). It round-trips exactly, so feeding the keys in
// chunks of whole tiles gives the bytes of one call. (attention.cu's hook sends calls with
// a state here when this path is selected; the native kernel's state layout differs.)
//
// Speed: the merge runs on the caller's stream after each group of kTilesPerMerge tiles.
// Running it on a second stream beside the next group's cuDNN calls (two group buffers)
// gave the same bytes and no gain on the H200 (S = 111274, kv_tile 1024: 431.6 TFLOP/s
// with, 437.6 without: cuDNN's kernel holds every SM's registers, so the merge cannot run
// beside it), so it was removed (git history: "merge overlap").
//
// Memory: all scratch comes from the caller's workspace (Backend::set_workspace),
// sized by attention_cudnn_workspace_bytes(H, Dh); a smaller workspace is a clear
// Status, never an allocation. cuDNN's handle (one per device, created on first use) and
// the plan cache live for the process.
//
// Diagnostics (Diagnostics::cudnn_verbose; the CLI maps LAYERSTREAM_CUDNN_VERBOSE=1 onto
// it) print, per graph build, the cuDNN version,
// every descriptor step's status (the attribute that failed, with cuDNN's last error
// string), how many engine configs each source gave (heuristics mode A, the fallback
// list, then every engine of the graph by global index) and why each was rejected.
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

// Queries per cuDNN call: Numerics::cudnn_q_chunk of the backend (part of the numerics:
// it picks the graph and so cuDNN's engine; a multiple of 64, validated by
// Backend::set_numerics; the workspace is sized for it: Layout below).
constexpr int64_t kTilesPerMerge = 4;   // key tiles per merge launch (speed only: same bits)
constexpr size_t kCudnnReserve = 64ull << 20;  // cuDNN's own workspace, at most
constexpr size_t kAlign = 256;

size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Workspace layout (each piece 256-byte aligned), for H heads of Dh:
//   Qs   bf16 [Qc, H, Dh]               staged query chunk (rows >= n zero)
//   Ot   bf16 [G][Qc, H, Dh]            per-tile outputs of one merge group
//   Lt   f32  [G][H, Qc]                per-tile LSE (cuDNN's stats layout)
//   acc  f32  [Qc, H, Dh]               merge state between groups
//   L    f32  [Qc, H]
//   ws   cuDNN workspace (kCudnnReserve)
struct Layout {
  size_t qs, ot, lt, acc, l, ws, total;
  size_t ot_stride, lt_stride;  // bytes between consecutive tiles of a group
};
Layout layout(int64_t H, int64_t Dh, int64_t qc) {
  Layout y{};
  const size_t rows = static_cast<size_t>(qc * H);
  const size_t tile_bf16 = align_up(rows * static_cast<size_t>(Dh) * 2);
  const size_t tile_lse = align_up(rows * 4);
  const size_t tiles = static_cast<size_t>(kTilesPerMerge);
  y.ot_stride = tile_bf16;
  y.lt_stride = tile_lse;
  y.qs = 0;
  y.ot = y.qs + tile_bf16;
  y.lt = y.ot + tiles * tile_bf16;
  y.acc = y.lt + tiles * tile_lse;
  y.l = y.acc + align_up(rows * static_cast<size_t>(Dh) * 4);
  y.ws = y.l + tile_lse;
  y.total = y.ws + kCudnnReserve;
  return y;
}

// Qs[r, h, :] = q[c0 + r, h, :] for r < n, zeros for n <= r < Qc. One thread per 8 elements.
__global__ void stage_queries(const uint16_t* __restrict__ q, int64_t sq, int64_t hq, int64_t c0, int64_t n,
                              uint16_t* __restrict__ qs, int64_t qc, int H, int Dh) {
  const int64_t chunks = Dh / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= qc * H * chunks) return;
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
  bool first, last;    // first group of the call: state from state_in or (-inf, 0); last: write out
  const float* state_in;  // f32 rows of p.state for this chunk (acc[Dh], L), or null
  float* state_out;       // last group without finalize: save the state here, else null
  int64_t st_row, st_head;  // p.state strides (elements)
  float* acc;          // f32 [Qc, H, Dh]
  float* l;            // f32 [Qc, H]
  uint16_t* out;       // bf16 rows [c0, c0 + n) of the caller's output (last group, finalize)
  int64_t so, ho;
  int64_t n;           // valid rows in this chunk
  int64_t qc;          // the query chunk Qc (the LSE rows' stride per head)
  int H, Dh;
};

// One thread per (row, head, 8 dims). The rule (file comment) per (row, head) uses only
// that row's tiles, in tile order, so its bits do not depend on the launch shape, on
// kTilesPerMerge or on the stream (the fp32 state round-trips through memory exactly).
__global__ void merge_tiles(const MergeArgs a) {
  const int64_t chunks = a.Dh / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n * a.H * chunks) return;
  const int64_t c = i % chunks, h = (i / chunks) % a.H, r = i / (chunks * a.H);
  const int64_t rh = r * a.H + h;
  float L = -INFINITY, acc[8];
  if (a.first) {
    if (a.state_in != nullptr) {
      const float* s = a.state_in + r * a.st_row + h * a.st_head;
      L = s[a.Dh];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = s[c * 8 + e];
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    }
  } else {
    L = a.l[rh];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = a.acc[rh * a.Dh + c * 8 + e];
  }
  for (int t = 0; t < a.ntiles; ++t) {
    const float lse = a.lt[t * a.lt_stride + h * a.qc + r];
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
  if (a.last && a.state_out == nullptr) {
    store8_bf16(a.out + r * a.so + h * a.ho + c * 8, true, 8, acc);
  } else if (a.last) {
    float* s = a.state_out + r * a.st_row + h * a.st_head;
    if (c == 0) s[a.Dh] = L;
#pragma unroll
    for (int e = 0; e < 8; ++e) s[c * 8 + e] = acc[e];
  } else {
    if (c == 0) a.l[rh] = L;
#pragma unroll
    for (int e = 0; e < 8; ++e) a.acc[rh * a.Dh + c * 8 + e] = acc[e];
  }
}

#ifdef LAYERSTREAM_CUDNN

constexpr int kMaxDevices = 64;
constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidStats = 5, kUidScale = 6;

std::string last_cudnn_error() {
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof last);
  return last;
}

Error cudnn_error(cudnnStatus_t s, const std::string& what) {
  const std::string last = last_cudnn_error();
  return make_error(ErrorCode::device, "cudnn attention: " + what + ": " + cudnnGetErrorString(s) +
                                           (last.empty() ? std::string() : " (" + last + ")"));
}

// Builds backend descriptors, remembering the first failure (later calls do nothing)
// and every descriptor it made (kept alive with the plan). With `log` set, prints every
// descriptor finalize and every failing step, with cuDNN's last error string.
struct Builder {
  std::vector<cudnnBackendDescriptor_t> made;
  cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
  std::string failed_at;
  std::string tag;  // "[unified kv=1024]" in the log
  bool log = false;

  bool ok() const { return status == CUDNN_STATUS_SUCCESS; }
  void note(cudnnStatus_t s, const char* what, bool is_step = false) {
    if (s != CUDNN_STATUS_SUCCESS && ok()) {
      status = s;
      failed_at = what;
      const std::string last = last_cudnn_error();
      if (!last.empty()) failed_at += " (" + last + ")";
      if (log) std::fprintf(stderr, "cudnn attention: %s %s: FAILED %s\n", tag.c_str(), failed_at.c_str(),
                            cudnnGetErrorString(s));
    } else if (s == CUDNN_STATUS_SUCCESS && is_step && log) {
      std::fprintf(stderr, "cudnn attention: %s %s: ok\n", tag.c_str(), what);
    }
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
    if (ok()) note(cudnnBackendFinalize(d), what, true);
  }
  void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t n, cudnnBackendDescriptor_t v,
                const char* what) {
    set(d, n, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, what);
  }

  cudnnBackendDescriptor_t tensor(const char* name, int64_t uid, cudnnDataType_t dt, const int64_t dims[4],
                                  const int64_t strides[4], bool is_virtual, bool by_value = false) {
    cudnnBackendDescriptor_t d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims");
    set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value) set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
    finalize(d, name);
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
// The last two: the forced graph form and the skipped heuristic configs (diagnostic
// settings, below).
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int64_t>;

// Per device: the cuDNN handle.
struct DeviceState {
  cudnnHandle_t handle = nullptr;
};

std::mutex g_mu;
DeviceState g_dev[kMaxDevices];
std::map<PlanKey, Plan*> g_plans;
std::map<PlanKey, std::string> g_refused;  // graphs cuDNN refused: fail fast with the first reason
bool g_version_logged = false;

Expected<DeviceState*> device_state(int device, bool log, int64_t qc) {
  LS_CHECK(device >= 0 && device < kMaxDevices);
  DeviceState& d = g_dev[device];
  if (!d.handle) {
    cudnnStatus_t s = cudnnCreate(&d.handle);
    if (s != CUDNN_STATUS_SUCCESS) {
      d.handle = nullptr;
      return cudnn_error(s, "cudnnCreate (cuDNN runtime " + std::to_string(cudnnGetVersion()) + ")");
    }
  }
  if (!g_version_logged && log) {
    g_version_logged = true;
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    std::fprintf(stderr,
                 "cudnn attention: cuDNN runtime %zu (headers %d), cudart %zu, device %d sm_%d%d, chunk %lld queries, "
                 "%lld tiles per merge\n",
                 cudnnGetVersion(), CUDNN_VERSION, cudnnGetCudartVersion(), dev, major, minor,
                 static_cast<long long>(qc), static_cast<long long>(kTilesPerMerge));
  }
  return &d;
}

// Two ways to say SDPA forward to cuDNN, tried in this order:
//   unified:   one CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR (Q, K, V, O, Stats, by-value
//              Scale; cuDNN >= 9.13.1). K is [b, h, s_kv, d], as Q.
//   composite: the ten-op graph cudnn_frontend expands SDPA into before cuDNN 9.21, which
//              cuDNN's fused flash-attention engine recognises:
//     S = Q K^T (fp32; K given as K^T [b, h, d, s_kv]) -> S * scale -> M = max_j
//     -> E = exp(S - M) -> Z = sum_j E -> Stats = M + log Z (fp32 out) -> P = E / Z
//     -> O = P V (bf16 out). P must be bf16 (the I/O type): the fused engine takes the
//     second matmul's A operand in the I/O type, and with an fp32 P no engine matches
//     (the cause of "0 engine configs" on cuDNN 9.14 in the first H200 run).
// Q, O: our staged [Qc, H, Dh] chunk (dims [1, H, Qc, Dh], BSHD strides); K, V: the
// caller's strided views of one tile; Stats: packed [1, H, Qc, 1] fp32.
// composite_f32p: the composite graph with an fp32 P, as the first H200 run built it
// (diagnostic only: it shows cuDNN refusing that graph).
enum class GraphForm { unified, composite, composite_f32p };

const char* form_name(GraphForm f) {
  return f == GraphForm::unified ? "unified SDPA_FWD" : f == GraphForm::composite ? "composite" : "composite (fp32 P)";
}

// Developer settings of the numerics (part of the plan key). They change which engine
// runs, so they may change bits; the defaults are what the tests and docs describe.
//   Numerics::cudnn_form = unified | composite | composite-f32p: only that graph form
//     ("" = auto: unified when cuDNN >= 9.13.1, then composite).
//   Numerics::cudnn_skip_configs = N: skip the first N configs of heuristics mode A.
int forced_form(const Numerics& n) {
  if (n.cudnn_form == "unified") return static_cast<int>(GraphForm::unified);
  if (n.cudnn_form == "composite") return static_cast<int>(GraphForm::composite);
  if (n.cudnn_form == "composite-f32p") return static_cast<int>(GraphForm::composite_f32p);
  return -1;  // "" (validated by set_numerics: nothing else reaches here)
}
int skipped_configs(const Numerics& n) { return static_cast<int>(std::max<int64_t>(0, n.cudnn_skip_configs)); }

// Engine global index and knob choices of an engine config, for messages.
std::string describe_cfg(cudnnBackendDescriptor_t cfg, int64_t* engine_index) {
  *engine_index = -1;
  std::string knobs;
  cudnnBackendDescriptor_t eng = nullptr;
  int64_t cnt = 0;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cnt, &eng) ==
        CUDNN_STATUS_SUCCESS)
      cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, engine_index);
    cudnnBackendDestroyDescriptor(eng);
  }
  constexpr int kMaxKnobs = 32;
  cudnnBackendDescriptor_t kc[kMaxKnobs] = {};
  int made = 0;
  for (; made < kMaxKnobs; ++made)
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &kc[made]) != CUDNN_STATUS_SUCCESS) break;
  int64_t nk = 0;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &nk, kc) ==
      CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < std::min<int64_t>(nk, made); ++i) {
      cudnnBackendKnobType_t type{};
      int64_t value = 0, c1 = 0;
      cudnnBackendGetAttribute(kc[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &c1, &type);
      cudnnBackendGetAttribute(kc[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &c1, &value);
      if (!knobs.empty()) knobs += ',';
      knobs += std::to_string(static_cast<int>(type));
      knobs += '=';
      knobs += std::to_string(value);
    }
  }
  for (int i = 0; i < made; ++i) cudnnBackendDestroyDescriptor(kc[i]);
  std::string r = "engine ";
  r += std::to_string(*engine_index);
  if (!knobs.empty()) {
    r += " knobs {";
    r += knobs;
    r += '}';
  }
  return r;
}

// Tries one engine config: finalizes a plan and checks its workspace. Returns the plan,
// or null with the reason appended to `why`.
cudnnBackendDescriptor_t try_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t cfg, const std::string& label,
                                  bool log, std::string& why, int64_t* workspace) {
  cudnnBackendDescriptor_t plan = nullptr;
  cudnnStatus_t ps = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
  if (ps == CUDNN_STATUS_SUCCESS)
    ps = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
  if (ps == CUDNN_STATUS_SUCCESS)
    ps = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  if (ps == CUDNN_STATUS_SUCCESS) ps = cudnnBackendFinalize(plan);
  int64_t ws = 0, cnt = 0;
  if (ps == CUDNN_STATUS_SUCCESS)
    ps = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt, &ws);
  std::string reason;
  if (ps != CUDNN_STATUS_SUCCESS) {
    reason = std::string("plan: ") + cudnnGetErrorString(ps);
    const std::string last = last_cudnn_error();
    if (!last.empty()) reason += " (" + last + ")";
  } else if (static_cast<size_t>(ws) > kCudnnReserve) {
    reason = "workspace " + std::to_string(ws) + " bytes > reserve " + std::to_string(kCudnnReserve);
  }
  if (log)
    std::fprintf(stderr, "cudnn attention:   %s: %s\n", label.c_str(),
                 reason.empty() ? ("ok, workspace " + std::to_string(ws) + " bytes").c_str() : reason.c_str());
  if (!reason.empty()) {
    why += " " + label + ": " + reason + ";";
    if (plan) cudnnBackendDestroyDescriptor(plan);
    return nullptr;
  }
  *workspace = ws;
  return plan;
}

// The attention graph of `form` for H heads of Dh, Qc queries against kv keys (K rows of
// stride sk, heads hk; V likewise sv, hv), built through `b` (its descriptors kept in
// b.made; b.ok() false at the first failure).
cudnnBackendDescriptor_t build_graph(Builder& b, GraphForm form, cudnnHandle_t handle, int64_t H, int64_t Dh,
                                     int64_t kv, int64_t sk, int64_t hk, int64_t sv, int64_t hv, int64_t Qc) {
  const int64_t q_dims[4] = {1, H, Qc, Dh}, q_str[4] = {Qc * H * Dh, Dh, H * Dh, 1};
  const int64_t v_dims[4] = {1, H, kv, Dh}, v_str[4] = {kv * sv, hv, sv, 1};
  const int64_t s_dims[4] = {1, H, Qc, kv}, s_str[4] = {H * Qc * kv, Qc * kv, kv, 1};
  const int64_t r_dims[4] = {1, H, Qc, 1}, r_str[4] = {H * Qc, Qc, 1, 1};
  const int64_t one[4] = {1, 1, 1, 1};
  const int64_t k_dims[4] = {1, H, kv, Dh}, k_str[4] = {kv * sk, hk, sk, 1};
  const int64_t kt_dims[4] = {1, H, Dh, kv}, kt_str[4] = {kv * sk, hk, 1, sk};
  auto Q = b.tensor("tensor Q", kUidQ, CUDNN_DATA_BFLOAT16, q_dims, q_str, false);
  auto V = b.tensor("tensor V", kUidV, CUDNN_DATA_BFLOAT16, v_dims, v_str, false);
  auto O = b.tensor("tensor O", kUidO, CUDNN_DATA_BFLOAT16, q_dims, q_str, false);
  auto Stats = b.tensor("tensor Stats", kUidStats, CUDNN_DATA_FLOAT, r_dims, r_str, false);
  auto Scale = b.tensor("tensor Scale (by value)", kUidScale, CUDNN_DATA_FLOAT, one, one, false, true);
  std::vector<cudnnBackendDescriptor_t> ops;
  if (form == GraphForm::unified) {
    auto K = b.tensor("tensor K", kUidK, CUDNN_DATA_BFLOAT16, k_dims, k_str, false);
    auto op = b.make(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR);
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, Q, "set SDPA Q");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, K, "set SDPA K");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, V, "set SDPA V");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, O, "set SDPA O");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, Stats, "set SDPA stats");
    b.set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, Scale, "set SDPA scale");
    b.finalize(op, "SDPA_FWD operation");
    ops.push_back(op);
  } else {
    auto K = b.tensor("tensor K^T", kUidK, CUDNN_DATA_BFLOAT16, kt_dims, kt_str, false);  // K^T view of K
    auto S = b.tensor("virtual S", 101, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    auto Ss = b.tensor("virtual S*scale", 102, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    auto M = b.tensor("virtual max", 103, CUDNN_DATA_FLOAT, r_dims, r_str, true);
    auto D = b.tensor("virtual S-max", 104, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    auto E = b.tensor("virtual exp", 105, CUDNN_DATA_FLOAT, s_dims, s_str, true);
    auto Z = b.tensor("virtual sum", 106, CUDNN_DATA_FLOAT, r_dims, r_str, true);
    auto LZ = b.tensor("virtual log sum", 107, CUDNN_DATA_FLOAT, r_dims, r_str, true);
    auto P = form == GraphForm::composite
                 ? b.tensor("virtual P (bf16)", 108, CUDNN_DATA_BFLOAT16, s_dims, s_str, true)
                 : b.tensor("virtual P (fp32)", 108, CUDNN_DATA_FLOAT, s_dims, s_str, true);
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
        ops.data(), "set graph ops");
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "set graph handle");
  b.finalize(graph, "operation graph");
  return graph;
}

Expected<Plan*> build_plan_form(GraphForm form, cudnnHandle_t handle, int64_t H, int64_t Dh, int64_t kv, int64_t sk,
                                int64_t hk, int64_t sv, int64_t hv, int skip, int64_t Qc, bool log) {
  Builder b;
  b.log = log;
  b.tag = std::string("[") + form_name(form) + " H=" + std::to_string(H) + " Dh=" + std::to_string(Dh) +
          " Qc=" + std::to_string(Qc) + " kv=" + std::to_string(kv) + "]";
  if (log) std::fprintf(stderr, "cudnn attention: %s building the graph\n", b.tag.c_str());
  cudnnBackendDescriptor_t graph = build_graph(b, form, handle, H, Dh, kv, sk, hk, sv, hv, Qc);
  if (!b.ok()) return cudnn_error(b.status, std::string(form_name(form)) + " graph: " + b.failed_at);

  // Engine configs, in order: heuristics mode A, the fallback list, then every engine the
  // graph has (by global index, default knobs). The first whose plan finalizes with a
  // workspace within the reserve stays pinned for this graph for the life of the process.
  std::string why;
  auto keep_plan = [&](cudnnBackendDescriptor_t plan, int64_t ws, const std::string& what,
                       const std::vector<cudnnBackendDescriptor_t>& extra) -> Plan* {
    auto* p = new Plan;
    p->keep = std::move(b.made);
    p->keep.insert(p->keep.end(), extra.begin(), extra.end());
    p->plan = plan;
    p->workspace = ws;
    p->engine = std::string(form_name(form)) + ", " + what;
    if (log)
      std::fprintf(stderr, "cudnn attention: %s -> %s, workspace %lld bytes\n", b.tag.c_str(), p->engine.c_str(),
                   static_cast<long long>(ws));
    return p;
  };
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const std::string mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics mode A" : "heuristics fallback";
    Builder hb;
    hb.log = log;
    hb.tag = b.tag + " " + mode_name;
    auto heur = hb.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    hb.set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "set heuristics graph");
    hb.set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "set heuristics mode");
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
      why += " " + mode_name + ": " + hb.failed_at + " " + cudnnGetErrorString(hb.status) + ";";
      continue;
    }
    if (log) std::fprintf(stderr, "cudnn attention: %s: %lld engine configs\n", hb.tag.c_str(), static_cast<long long>(got));
    if (got == 0) why += " " + mode_name + ": 0 engine configs;";
    for (int64_t i = mode == CUDNN_HEUR_MODE_A ? std::min<int64_t>(skip, got) : 0; i < got; ++i) {
      int64_t engine_index = -1;
      const std::string label = mode_name + " config " + std::to_string(i) + " (" +
                                describe_cfg(cfgs[static_cast<size_t>(i)], &engine_index) + ")";
      int64_t ws = 0;
      cudnnBackendDescriptor_t plan = try_plan(handle, cfgs[static_cast<size_t>(i)], label, log, why, &ws);
      if (plan) return keep_plan(plan, ws, label, hb.made);
    }
  }
  // Every engine of the graph by global index (heuristics bypassed).
  int64_t count = 0, c1 = 0;
  cudnnStatus_t cs =
      cudnnBackendGetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &c1, &count);
  if (log)
    std::fprintf(stderr, "cudnn attention: %s engine global count: %lld (%s)\n", b.tag.c_str(),
                 static_cast<long long>(count), cudnnGetErrorString(cs));
  for (int64_t gi = 0; cs == CUDNN_STATUS_SUCCESS && gi < count; ++gi) {
    Builder eb;
    eb.tag = b.tag + " engine " + std::to_string(gi);
    auto eng = eb.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    eb.set_desc(eng, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph, "set engine graph");
    eb.set(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &gi, "set engine index");
    eb.finalize(eng, "engine");  // NOT_SUPPORTED for engines that do not match the graph
    auto cfg = eb.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    eb.set_desc(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, eng, "set config engine");
    eb.finalize(cfg, "engine config");
    if (!eb.ok()) {
      if (log)
        std::fprintf(stderr, "cudnn attention:   engine %lld: %s %s\n", static_cast<long long>(gi),
                     eb.failed_at.c_str(), cudnnGetErrorString(eb.status));
      for (auto d : eb.made) cudnnBackendDestroyDescriptor(d);
      continue;
    }
    int64_t ws = 0;
    const std::string label = "engine " + std::to_string(gi) + " (default knobs)";
    cudnnBackendDescriptor_t plan = try_plan(handle, cfg, label, log, why, &ws);
    if (plan) return keep_plan(plan, ws, label, eb.made);
    for (auto d : eb.made) cudnnBackendDestroyDescriptor(d);
  }
  if (cs != CUDNN_STATUS_SUCCESS) why += std::string(" engine count: ") + cudnnGetErrorString(cs) + ";";
  else if (count > 0) why += " none of the graph's " + std::to_string(count) + " engines finalized a plan;";
  return make_error(ErrorCode::unsupported,
                    std::string("cudnn attention: no engine config gave a usable plan for the ") + form_name(form) +
                        " graph:" + why);
}

Expected<Plan*> build_plan(cudnnHandle_t handle, int64_t H, int64_t Dh, int64_t kv, int64_t sk, int64_t hk, int64_t sv,
                           int64_t hv, int forced, int skip, int64_t Qc, bool log) {
  if (forced >= 0)
    return build_plan_form(static_cast<GraphForm>(forced), handle, H, Dh, kv, sk, hk, sv, hv, skip, Qc, log);
  std::string unified_why = "skipped (cuDNN runtime " + std::to_string(cudnnGetVersion()) + " < 91301)";
  if (cudnnGetVersion() >= 91301) {
    auto unified = build_plan_form(GraphForm::unified, handle, H, Dh, kv, sk, hk, sv, hv, skip, Qc, log);
    if (unified.ok()) return unified;
    unified_why = unified.error().message;
  }
  auto composite = build_plan_form(GraphForm::composite, handle, H, Dh, kv, sk, hk, sv, hv, skip, Qc, log);
  if (composite.ok()) return composite;
  return make_error(ErrorCode::unsupported, "cuDNN " + std::to_string(cudnnGetVersion()) + ": unified SDPA op: " +
                                                unified_why + " | composite graph: " + composite.error().message +
                                                " (Diagnostics::cudnn_verbose, e.g. the CLI's developer "
                                                "variable LAYERSTREAM_CUDNN_VERBOSE=1, with CUDNN_LOGLEVEL_DBG=2 "
                                                "CUDNN_LOGDEST_DBG=stderr prints every step; attention native "
                                                "(--attention native) runs the built-in kernel instead)");
}

// The device's cuDNN handle and the plans for the full tile length and the last, shorter
// tile (built once per graph key and kept for the process; a refused graph fails fast).
struct TilePlans {
  DeviceState* dev = nullptr;
  Plan* full = nullptr;
  Plan* last = nullptr;
};
Expected<TilePlans> tile_plans(const CudaContext& ctx, const TensorView& k, const TensorView& v, int64_t H, int64_t Dh,
                               int64_t Mk, int64_t ntiles, int64_t kv_tile, int64_t q_chunk, bool log) {
  std::lock_guard<std::mutex> lock(g_mu);
  TilePlans plans;
  LS_ASSIGN_OR_RETURN(plans.dev, device_state(ctx.device, log, q_chunk));
  DeviceState* dev = plans.dev;
  const int forced = forced_form(ctx.numerics), skip = skipped_configs(ctx.numerics);
  auto get = [&](int64_t kv) -> Expected<Plan*> {
    const PlanKey key{ctx.device, H, Dh, kv, k.stride[0], k.stride[1], v.stride[0], v.stride[1], forced, skip, q_chunk};
    auto it = g_plans.find(key);
    if (it != g_plans.end()) return it->second;
    auto refused = g_refused.find(key);
    if (refused != g_refused.end()) return make_error(ErrorCode::unsupported, refused->second);
    auto built =
        build_plan(dev->handle, H, Dh, kv, k.stride[0], k.stride[1], v.stride[0], v.stride[1], forced, skip, q_chunk, log);
    if (!built.ok()) {
      if (built.error().code == ErrorCode::unsupported) g_refused[key] = built.error().message;
      return built.error();
    }
    g_plans[key] = built.value();
    return built.value();
  };
  const int64_t full_len = std::min(kv_tile, Mk), last_len = Mk - (ntiles - 1) * kv_tile;
  LS_ASSIGN_OR_RETURN(plans.full, get(full_len));
  LS_ASSIGN_OR_RETURN(plans.last, get(last_len));
  return plans;
}

Status run_tile(cudnnHandle_t handle, const Plan& plan, void* qs, const void* k, const void* v, void* o, void* stats,
                float scale, void* ws) {
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (s != CUDNN_STATUS_SUCCESS) return cudnn_error(s, "variant pack");
  const int64_t uids[6] = {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale};
  void* ptrs[6] = {qs, const_cast<void*>(k), const_cast<void*>(v), o, stats, &scale};  // scale: host, by value
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

bool attention_cudnn_selected(const CudaContext& ctx) { return ctx.numerics.attention == AttentionAlgorithm::cudnn; }

bool attention_cudnn_built() {
#ifdef LAYERSTREAM_CUDNN
  return true;
#else
  return false;
#endif
}

size_t attention_cudnn_workspace_bytes(int64_t H, int64_t Dh, int64_t q_chunk) {
  LS_CHECK(H > 0 && Dh > 0 && q_chunk > 0);
  return layout(H, Dh, q_chunk).total;
}

Status attention_cudnn(CudaContext& ctx, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const AttentionParams& p) {
#ifndef LAYERSTREAM_CUDNN
  (void)ctx, (void)q, (void)k, (void)v, (void)out, (void)p;
  return unsupported("attention", "attention cudnn but this build has no cuDNN; use attention auto or native "
                                  "(Backend::set_numerics refuses it: this is a bug)");
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
  const bool streamed = p.state.data != nullptr;
  if (streamed) {
    LS_CHECK_MSG(p.state.dtype == DType::f32 && p.state.ndim == 3 && p.state.shape[0] == Mq &&
                     p.state.shape[1] == H && p.state.shape[2] == Dh + kAttentionStateExtra &&
                     p.state.inner_contiguous(),
                 "attention (cudnn): state " + p.state.shape_str() + " for q " + q.shape_str());
  }
  if (Mq == 0) return Status();
  if (Mk == 0) return unsupported("attention (cudnn)", "no keys");
  const int64_t q_chunk = ctx.numerics.cudnn_q_chunk;  // queries per cuDNN call (validated: multiple of 64)
  const bool log = ctx.diagnostics.cudnn_verbose;
  const Layout lay = layout(H, Dh, q_chunk);
  if (ctx.workspace == nullptr || ctx.workspace_bytes < lay.total)
    return make_error(ErrorCode::invalid_argument,
                      "cuda attention (cudnn): the backend workspace has " + std::to_string(ctx.workspace_bytes) +
                          " bytes, the cuDNN path needs " + std::to_string(lay.total) + " for H = " +
                          std::to_string(H) + ", head_dim = " + std::to_string(Dh) +
                          " at q_chunk " + std::to_string(q_chunk) +
                          " (attention_cudnn_workspace_bytes); hand a larger view to set_workspace or use "
                          "attention native");
  const float scale = attention_scale(p, Dh);
  if (!(scale > 0.0f)) return unsupported("attention (cudnn)", "softmax scale must be positive");

  // Plans for the full tile length and (if any) the last, shorter tile.
  const int64_t ntiles = div_up(Mk, p.kv_tile);
  LS_ASSIGN_OR_RETURN(const TilePlans plans, tile_plans(ctx, k, v, H, Dh, Mk, ntiles, p.kv_tile, q_chunk, log));
  const DeviceState* dev = plans.dev;
  const Plan* plan_full = plans.full;
  const Plan* plan_last = plans.last;
  const cudnnHandle_t handle = dev->handle;
  cudnnStatus_t ss = cudnnSetStream(handle, ctx.stream);
  if (ss != CUDNN_STATUS_SUCCESS) return cudnn_error(ss, "cudnnSetStream");

  // Everything runs on the caller's stream, in order: stage a chunk, then per group of
  // tiles the cuDNN calls and the merge that reads their O_t / LSE_t.
  uint8_t* ws = static_cast<uint8_t*>(ctx.workspace);
  uint16_t* qs = reinterpret_cast<uint16_t*>(ws + lay.qs);
  const auto* kb = k.ptr<const uint16_t>();
  const auto* vb = v.ptr<const uint16_t>();
  const int threads = 256;
  Status failed;
  for (int64_t c0 = 0; c0 < Mq && failed.ok(); c0 += q_chunk) {
    const int64_t n = std::min(q_chunk, Mq - c0);
    const int64_t stage_n = q_chunk * H * (Dh / 8);
    stage_queries<<<static_cast<unsigned>(div_up(stage_n, threads)), threads, 0, ctx.stream>>>(
        q.ptr<const uint16_t>(), q.stride[0], q.stride[1], c0, n, qs, q_chunk, static_cast<int>(H), static_cast<int>(Dh));
    LS_CUDA_CHECK_LAUNCH();
    for (int64_t g0 = 0; g0 < ntiles; g0 += kTilesPerMerge) {
      const int64_t gn = std::min(kTilesPerMerge, ntiles - g0);
      const size_t ot0 = lay.ot, lt0 = lay.lt;
      for (int64_t t = g0; t < g0 + gn; ++t) {
        const int64_t t0 = t * p.kv_tile;
        const Plan& plan = t == ntiles - 1 ? *plan_last : *plan_full;
        Status s = run_tile(handle, plan, qs, kb + t0 * k.stride[0], vb + t0 * v.stride[0],
                            ws + ot0 + static_cast<size_t>(t - g0) * lay.ot_stride,
                            ws + lt0 + static_cast<size_t>(t - g0) * lay.lt_stride, scale, ws + lay.ws);
        if (!s.ok()) {
          failed = s;
          break;
        }
      }
      if (!failed.ok()) break;
      MergeArgs a{};
      a.ot = reinterpret_cast<const uint16_t*>(ws + ot0);
      a.lt = reinterpret_cast<const float*>(ws + lt0);
      a.ot_stride = static_cast<int64_t>(lay.ot_stride / 2);
      a.lt_stride = static_cast<int64_t>(lay.lt_stride / 4);
      a.ntiles = static_cast<int>(gn);
      a.first = g0 == 0;
      a.last = g0 + gn == ntiles;
      if (streamed) {
        a.st_row = p.state.stride[0];
        a.st_head = p.state.stride[1];
        if (p.state_in) a.state_in = p.state.ptr<const float>() + c0 * a.st_row;
        if (!p.finalize) a.state_out = p.state.ptr<float>() + c0 * a.st_row;
      }
      a.acc = reinterpret_cast<float*>(ws + lay.acc);
      a.l = reinterpret_cast<float*>(ws + lay.l);
      a.out = out.ptr<uint16_t>() + c0 * out.stride[0];
      a.so = out.stride[0];
      a.ho = out.stride[1];
      a.n = n;
      a.qc = q_chunk;
      a.H = static_cast<int>(H);
      a.Dh = static_cast<int>(Dh);
      const int64_t merge_n = n * H * (Dh / 8);
      merge_tiles<<<static_cast<unsigned>(div_up(merge_n, threads)), threads, 0, ctx.stream>>>(a);
      LS_CUDA_CHECK_LAUNCH();
    }
  }
  return failed;
#endif
}

}  // namespace ls::cuda
