// The backend interface: memory, copies and every op the H3 forward needs.
//
// Contract for every op (DESIGN.md §1, h3-model.md §3):
//  - Ops are row-wise over dimension 0 ("tokens"). A row's result depends on that
//    row's inputs only, through a reduction order fixed by the op and independent of
//    how many rows are passed, which other rows are present, or how threads/blocks
//    are split. So computing rows [a, b) alone gives exactly the bytes of computing
//    all rows (tested with memcmp). Attention is row-wise over queries.
//  - Ops never allocate: outputs and scratch are views the caller took from an Arena.
//  - Views may be strided (row stride and, where noted, head stride); the innermost
//    dimension is contiguous.
//  - Arithmetic is fp32 (bf16 inputs are widened exactly); results are rounded once
//    to the output dtype unless a rounding point is named in the op's comment.
//  - Outputs may alias inputs only where the comment says "in place".
//  - Failures that depend on input (unsupported dtype combination) return a Status;
//    broken invariants (shape mismatch between arguments) are bugs (LS_CHECK).
//
// The CPU backend (src/backend/cpu) is the reference every other backend is checked
// against by tests/test_backend_ops (parity harness).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "backend/numerics.h"
#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ls {

// Floats of attention state per (query, head) beyond the Dh accumulators: the running
// max and the running sum (a backend may keep the sum as up to 7 partial sums, as the
// CUDA kernel's threads do). The state of a query slice is f32 [Mq, H, Dh + 8].
constexpr int64_t kAttentionStateExtra = 8;

struct AttentionParams {
  float scale = 0.0f;   // softmax scale; 0 means 1/sqrt(head_dim)
  int64_t kv_tile = 1024;  // keys per tile: a numerics setting (DESIGN.md §1.2)
  // Streamed keys (K/V offload, DESIGN.md §1.2): the key sequence is fed in consecutive
  // chunks, one call per chunk, in order; every chunk but the last has a multiple of
  // kv_tile keys, so the tiles are the same as in one call over all keys.
  //   state: empty view = one call over all keys (the default). Otherwise f32
  //          [Mq, H, Dh + kAttentionStateExtra] on the device, the fp32 running state
  //          (m, l, acc) of every (query, head), in a backend-private layout.
  //   state_in: start from `state` (a previous chunk's) instead of (-inf, 0, 0).
  //   finalize: write out = bf16(acc / l) after this chunk; else save the state to
  //          `state` and leave out untouched.
  // The state round-trips in fp32 without change, so feeding chunks gives exactly the
  // bytes of one call over all keys (tested with memcmp on every backend).
  TensorView state;
  bool state_in = false;
  bool finalize = true;
};

// The softmax scale every backend applies: p.scale, or 1/sqrt(Dh) rounded once from double
// when p.scale is 0 (the one statement of that default; a bit of it is a bit of every output).
inline float attention_scale(const AttentionParams& p, int64_t Dh) {
  return p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
}

// invalid_argument unless p's streamed-key settings fit a chunk of Mk keys for queries
// [Mq, H, Dh]: a state view exactly f32 [Mq, H, Dh + kAttentionStateExtra], contiguous,
// whenever state_in or !finalize; a non-final chunk a multiple of kv_tile keys. Every
// backend calls it (src/backend/attention_state.cpp), so the rules and messages agree.
Status check_attention_state(const AttentionParams& p, int64_t Mq, int64_t Mk, int64_t H, int64_t Dh);

// Prepared keys of INT8 attention (AttentionAlgorithm::int8; docs/int8-attention.md §3, §5):
// keys [k0, k0 + n) of a sequence (one chunk, or all keys) after Backend::int8_prepare.
struct Int8Keys {
  TensorView k8;   // i8  [n, H, Dh]: rotated, centred, per-row quantised keys (inner contiguous)
  TensorView sk;   // f32 [n, H]: the key scales (contiguous), per key; contract v4: the 16 keys of
                   //     a group (absolute 128-key tile, key % 8) hold the group's one scale
  TensorView v8t;  // i8  [H, Dh, n], strides {Dh * ld, ld, 1}: V per channel, keys contiguous;
                   //     ld >= n, ld % 16 == 0; columns [n, ld) are never read
  TensorView vs;   // f32 [NB, 2, H, Dh] (contiguous): the V scales of EVERY statistics block
                   //     of the sequence (NB = int8_stat_blocks(S)), indexed by absolute block
                   //     b = key / kInt8StatBlock: [b][0] = sv_b, [b][1] = rho_b (docs §3);
                   //     shared by every chunk of the sequence
  int64_t k0 = 0;  // the absolute index (in the sequence) of this set's first key
  int64_t keys() const { return k8.empty() ? 0 : k8.size(0); }
  // Keys [a, b) of this set (a % 16 == 0 unless b == a: v8t's rows keep their 16-byte
  // alignment); k0 moves by a, vs is the same table.
  Int8Keys slice(int64_t a, int64_t b) const;
};

// One linear layer's weight in its stored format (issue 14; comfyui-and-quantized-weights.md
// §2-3). A plain bf16/f32 weight is format bf16 with only `w` set.
enum class WeightFormat : uint8_t { bf16 = 0, int8_convrot = 1, fp8_e4m3 = 2 };
const char* weight_format_name(WeightFormat f);  // "bf16", "int8_convrot", "fp8_e4m3"

// A LoRA side path of a quantised linear (issue 17; docs/lora.md, docs/numerics.md "LoRA
// side path"): the LoRA patches of an int8 / fp8 weight, which cannot be merged into it
// bit-reproducibly (ComfyUI requantises with seeded stochastic rounding), applied to the
// layer's input instead. Rank R = the patches' ranks summed (patches concatenated along R
// in the order the LoRAs are given); empty = no side path.
constexpr int64_t kLoraSideMaxRank = 256;  // the CUDA kernel keeps a row block's [32, R] on chip
struct LoraSide {
  TensorView down;  // f32 [K, R]: down_p^T of every patch, concatenated along R
  TensorView up;    // f32 [N, R]: fl32(s_p * up_p), s_p = strength * alpha / rank (double, then fl32)
  bool empty() const { return down.empty(); }
  int64_t rank() const { return down.empty() ? 0 : down.size(1); }
};

struct LinearWeight {
  WeightFormat format = WeightFormat::bf16;
  TensorView w;              // bf16|f32 [N, K] | i8 [N, K] rotated per group (W * H_G) | f8e4m3 [N, K]
  TensorView scale;          // int8_convrot: f32 [N] (per output row); fp8_e4m3: f32 [1]; else empty
  float input_scale = 1.0f;  // fp8_e4m3: the static activation scale s_a (1 = none)
  int64_t group = 0;         // int8_convrot: ConvRot group G (a power of 4 dividing K: 64, 256)
  bool dynamic_act = false;  // fp8_e4m3: per-row amax/448 activation scale (engine option, lossy)
  LoraSide lora;             // int8_convrot / fp8_e4m3 with LoRAs: the side path (linear_lora applies it)

  LinearWeight() = default;
  // A plain weight (what every linear was before quantised formats).
  LinearWeight(const TensorView& plain) : w(plain) {}  // NOLINT: implicit on purpose
  int64_t out_features() const { return w.size(0); }
  int64_t in_features() const { return w.size(1); }
  // Output rows [a, b) (the qkv weight's Q, K or V rows): weight rows and, per-row
  // int8 scales, scale rows; a per-tensor scale is kept; the LoRA side path's up rows.
  LinearWeight rows(int64_t a, int64_t b) const;
};

// Options of Backend::linear.
struct LinearOptions {
  bool swiglu_input = false;  // x is u bf16 [M, 2K] = [gate | up]; the input is silu(gate) * up
};

// Queues of a backend. Work on one queue runs in call order; work on different queues
// may overlap and is ordered only by fences. The CPU backend runs everything at once
// (every queue is synchronous), so fences are no-ops there.
enum class Queue { compute = 0, transfer = 1 };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual std::string name() const = 0;  // "cpu", "cuda:0 (NVIDIA H200)"

  // ---- memory ------------------------------------------------------------------
  // The resource arenas on this device draw from (the only raw allocator).
  virtual MemoryResource& memory() = 0;
  // Copy between views of equal shape and dtype (host<->device or within a device).
  // Both views must be contiguous, or both row-strided with contiguous rows.
  virtual Status copy(const TensorView& dst, const TensorView& src) = 0;
  // Wait until all work queued on this backend has finished.
  virtual Status synchronize() = 0;

  // ---- streaming (weight streaming, K/V and residual offload) --------------------
  // Host memory the device copies from/to asynchronously (page-locked on CUDA; plain
  // host memory on the CPU). Arenas over it hold streamed weights and offloaded K/V.
  virtual MemoryResource& pinned_host_memory() = 0;
  // Queue dst <- src on queue q (same view rules as copy()). The copy starts after
  // earlier work on q; host memory involved must be pinned_host_memory() for the copy
  // to overlap with compute, and must stay untouched until the copy is known done.
  virtual Status copy_async(const TensorView& dst, const TensorView& src, Queue q) = 0;
  // Fences order work across queues (CUDA: events without timing). A user takes a
  // handle from the backend's pool and holds it while it orders work with it; the
  // handle goes back to the pool when destroyed, so no two users share a fence and no
  // file partitions fence ids by hand:
  //   LS_ASSIGN_OR_RETURN(Backend::Fence loaded, backend.take_fence());
  //   LS_TRY(loaded.signal(Queue::transfer));  // completes when the transfer queue's work so far has
  //   LS_TRY(loaded.wait(Queue::compute));     // later compute work waits for that signal
  // signal(q): the fence completes when everything queued on q so far has. wait(q):
  // later work on q waits for the last signal (a fence never signalled is complete; a
  // recycled one at most waits for its previous holder's last signal, work that was
  // ordered before the handle was given back). host_wait(): the host blocks until the
  // last signal. Handles must not outlive the backend.
  class Fence {
   public:
    Fence() = default;
    Fence(Fence&& o) noexcept : be_(o.be_), id_(o.id_) { o.be_ = nullptr, o.id_ = -1; }
    Fence& operator=(Fence&& o) noexcept {
      if (this != &o) {
        reset();
        be_ = o.be_, id_ = o.id_;
        o.be_ = nullptr, o.id_ = -1;
      }
      return *this;
    }
    Fence(const Fence&) = delete;
    Fence& operator=(const Fence&) = delete;
    ~Fence() { reset(); }
    bool valid() const { return be_ != nullptr; }
    int id() const { return id_; }  // the raw id (0 .. kFences-1), for messages and tests
    Status signal(Queue q) const {
      LS_CHECK_MSG(valid(), "signal on an empty fence handle");
      return be_->signal(q, id_);
    }
    Status wait(Queue q) const {
      LS_CHECK_MSG(valid(), "wait on an empty fence handle");
      return be_->wait(q, id_);
    }
    Status host_wait() const {
      LS_CHECK_MSG(valid(), "host wait on an empty fence handle");
      return be_->host_wait(id_);
    }
    void reset() {  // back to the pool (no-op on an empty handle)
      if (be_) be_->give_back_fence(id_);
      be_ = nullptr, id_ = -1;
    }

   private:
    friend class Backend;
    Fence(Backend* be, int id) : be_(be), id_(id) {}
    Backend* be_ = nullptr;
    int id_ = -1;
  };
  // A free fence of the pool, or out_of_memory naming the pool's size when all kFences
  // are held (a weight store that streams holds 4, a forward with K/V offload 8 more).
  Expected<Fence> take_fence() {
    std::lock_guard<std::mutex> lock(fence_mu_);
    for (int f = 0; f < kFences; ++f)
      if (!(fence_taken_ & (1u << f))) {
        fence_taken_ |= 1u << f;
        return Fence(this, f);
      }
    return make_error(ErrorCode::out_of_memory, "all " + std::to_string(kFences) + " fences of " + name() +
                                                    " are held (by the engines on this backend): destroy an engine first");
  }
  int fences_held() const {  // handles taken and not given back
    std::lock_guard<std::mutex> lock(fence_mu_);
    int n = 0;
    for (int f = 0; f < kFences; ++f) n += (fence_taken_ >> f) & 1u;
    return n;
  }
  // The raw fences 0 .. kFences-1 that the handles wrap (same semantics, by id). Only
  // backend tests and benchmarks that own the backend alone use ids directly.
  static constexpr int kFences = 32;
  virtual Status signal(Queue q, int fence) = 0;
  virtual Status wait(Queue q, int fence) = 0;
  virtual Status host_wait(int fence) = 0;

 private:
  void give_back_fence(int f) {
    std::lock_guard<std::mutex> lock(fence_mu_);
    LS_CHECK_MSG(fence_taken_ & (1u << f), "fence " + std::to_string(f) + " given back twice");
    fence_taken_ &= ~(1u << f);
  }
  mutable std::mutex fence_mu_;
  uint32_t fence_taken_ = 0;  // bit f: fence f is held by a handle
  static_assert(kFences <= 32, "the pool is one 32-bit mask");

 public:

  // Free and total bytes of the device's memory as the driver sees them (all
  // processes), for confirming a budget from outside the arenas (cudaMemGetInfo).
  // Backends without such a notion return unsupported.
  virtual Status device_memory_info(uint64_t* free_bytes, uint64_t* total_bytes) {
    (void)free_bytes;
    (void)total_bytes;
    return Status(make_error(ErrorCode::unsupported, name() + " has no device memory to report"));
  }

  // ---- a caller's queue (C API / Python interop, issue 13) ------------------------
  // `stream` is the caller's queue handle: CUDA a cudaStream_t (nullptr = the legacy
  // default stream). wait_external: later work on every queue of this backend waits for
  // what is queued on `stream` so far (an event, no device-wide synchronisation).
  // signal_external: later work on `stream` waits for everything queued on this backend
  // so far. The CPU backend runs everything at once: both are no-ops there.
  virtual Status wait_external(void* stream) { (void)stream; return Status(); }
  virtual Status signal_external(void* stream) { (void)stream; return Status(); }

  // ---- scratch -------------------------------------------------------------------
  // Bytes of scratch the backend's ops need (0 on the CPU; the CUDA GEMM's cuBLASLt
  // workspace). The caller takes this many bytes from its arena once and hands them
  // over with set_workspace before the first op; the view must stay valid while ops
  // run. The amount is a constant of the backend, so it never changes a result.
  virtual size_t workspace_bytes() const { return 0; }
  virtual Status set_workspace(const TensorView& ws) { (void)ws; return Status(); }

  // ---- numerics (backend/numerics.h, DESIGN.md §1) ---------------------------------
  // The settings that may change output bits come in here, never from the
  // environment. set_numerics validates them (ls::validate) and refuses, with
  // invalid_argument or unsupported and a message saying what to change, what this
  // backend cannot honour (cudnn attention on the CPU or on a build without cuDNN,
  // cublaslt fp32 GEMMs on the CPU, a CUDA kernel knob that the resolved algorithm does
  // not use); on refusal the previous settings stay. Call it before set_workspace: the
  // workspace may depend on the settings (CUDA: the cuDNN query chunk), and a workspace
  // already set that is too small for the new settings is refused. A backend starts
  // with the default Numerics{} resolved.
  virtual Status set_numerics(const Numerics& n, const Diagnostics& d) = 0;
  // The RESOLVED settings in force: backend_default replaced by the concrete algorithm,
  // kv_tile 0 by that algorithm's default, native_variant "" by "4x2" where the native
  // CUDA kernel runs. What every report and output file records (describe / to_json).
  virtual Numerics numerics() const = 0;
  virtual Diagnostics diagnostics() const = 0;
  // The model this backend will run, by its attention head dim (Session::load_weights
  // calls it after opening the weights; 0 = not known, the state set_numerics leaves).
  // Where the numerics last given asked for attention auto (backend_default), the backend
  // may resolve auto to an algorithm that serves only some head dims; numerics() then
  // records that algorithm. CUDA: auto -> hopper at head dim 128 on an sm_90 device in a
  // build with the Hopper kernel and the cudnn/native knobs at their defaults, else as
  // set_numerics resolved it. An explicit algorithm is never changed. Call it before
  // set_workspace (it re-resolves like set_numerics, with the same refusals).
  virtual Status set_model_head_dim(int64_t head_dim) {
    (void)head_dim;
    return Status();
  }

  // The kv_tile (AttentionParams::kv_tile, a numerics setting: DESIGN.md §1.2) of the
  // resolved numerics: the Numerics::kv_tile given, or (0) the default of the resolved
  // attention algorithm, at which tiling costs under 2 % of attention time (CPU and the
  // native CUDA kernel 1024, cuDNN 8192). Callers plan with it, so that the plan's
  // kv_tile is the one recorded in numerics().
  int64_t default_kv_tile() const { return numerics().kv_tile; }

  // ---- ops ---------------------------------------------------------------------
  // out[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n])      (PyTorch's F.linear)
  //   x: bf16|f32 [M, K]; w: same dtype as x, or bf16 with f32 x (widened exactly);
  //   bias: null or f32|bf16 [N] (added in fp32 before the one output rounding);
  //   out: bf16|f32 [M, N]. Accumulation in fp32 with a per-element order that
  //   depends only on K (the backend documents it).
  virtual Status gemm(const TensorView& x, const TensorView& w, const TensorView* bias, const TensorView& out) = 0;

  // out = bf16( x * rsqrt(mean(x^2) + eps) * w ), fp32 inside, one rounding.
  //   x: bf16 [M, D]; w: bf16 [D]; out: bf16 [M, D] (may alias x: in place).
  virtual Status rms_norm(const TensorView& x, const TensorView& w, float eps, const TensorView& out) = 0;

  // AdaLN modulation of row m with table row r = rows[m]:
  //   out bf16: sc = bf16(1 + bf16(scale[r])); out = bf16(bf16(in * sc) + bf16(shift[r]))
  //   out f32 (pruned/fp32 final layer: tables f32): out = fl32(fl32(in * (1 + scale[r])) + shift[r])
  //   in: bf16 [M, D]; shift, scale: bf16|f32 [R, D] (row-strided views of the AdaLN
  //   output); rows: i32 [M] on the backend's device; out: bf16|f32 [M, D] (may alias in).
  virtual Status modulate(const TensorView& in, const TensorView& shift, const TensorView& scale,
                          const TensorView& rows, const TensorView& out) = 0;

  // RMSNorm then AdaLN modulation of each row (the DiT block's norm1/norm2 + modulate,
  // h3-model.md §2.9 steps 2 and 5), byte for byte the composition
  //   rms_norm(x, w, eps, out); modulate(out, shift, scale, rows, out);
  // with both rounding points kept: h = bf16(x * rrms * w) as in rms_norm, then
  //   out = bf16(bf16(h * bf16(1 + bf16(scale[r]))) + bf16(shift[r])),  r = rows[m].
  //   x: bf16 [M, D]; w: bf16 [D]; shift, scale: bf16|f32 [R, D] (row-strided views of
  //   the AdaLN output); rows: i32 [M] on the backend's device; out: bf16 [M, D] (may
  //   alias x: in place). Unsupported dtypes return rms_norm's / modulate's Status.
  // A backend may fuse the two into one pass over the rows (CUDA: saves writing h and
  // reading it back, one read + one write of [M, D] bf16); this default is the
  // composition itself, so the CPU reference needs nothing.
  virtual Status rms_norm_modulate(const TensorView& x, const TensorView& w, float eps, const TensorView& shift,
                                   const TensorView& scale, const TensorView& rows, const TensorView& out) {
    LS_TRY(rms_norm(x, w, eps, out));
    return modulate(out, shift, scale, rows, out);
  }

  // In place: x[m] = bf16( fma(y[m], bf16(gate[rows[m]]), x[m]) )  (one rounding).
  //   x, y: bf16 [M, D]; gate: bf16|f32 [R, D]; rows: i32 [M].
  virtual Status gated_add(const TensorView& x, const TensorView& y, const TensorView& gate,
                           const TensorView& rows) = 0;

  // In place: x = bf16(x + y) (token refiner residual).
  virtual Status add(const TensorView& x, const TensorView& y) = 0;

  // Per-head RMSNorm over head_dim, then (if rope is given) split-half partial RoPE,
  // in place (h3-model.md §2.8):
  //   rrms = 1/sqrt(sum_d x_d^2 / Dh + eps); n_d = bf16(x_d * rrms * w_d) (fp32, one rounding);
  //   for pair j < P (rot_dim = 2P, P = rope.size(1)): x0 = n_j, x1 = n_{j+P}, c, s from the table,
  //     out_j = bf16(c*x0 - s*x1), out_{j+P} = bf16(s*x0 + c*x1); dims >= 2P keep n_d.
  //   x: bf16 [M, H, Dh] (strided: row stride, head stride); w: bf16 [Dh];
  //   rope: empty view (no rotation) or bf16 [M, P, 2] holding (cos, sin) per pair.
  virtual Status qk_norm_rope(const TensorView& x, const TensorView& w, const TensorView& rope, float eps) = 0;

  // SwiGLU: out[m, i] = bf16( bf16(silu(u[m, i])) * u[m, F + i] ), silu(g) = g / (1 + exp(-g)).
  //   u: bf16 [M, 2F] (gate = first half); out: bf16 [M, F].
  virtual Status swiglu(const TensorView& u, const TensorView& out) = 0;

  // In place, fp32: x = silu(x). x: f32 [M, N].
  virtual Status silu(const TensorView& x) = 0;

  // Sinusoidal time embedding, cos first (h3-model.md §2.5):
  //   half = N/2, freq_j = exp(-ln(10000) * j / half), arg = t[m] * freq_j,
  //   out[m] = [cos(arg_0..half-1), sin(arg_0..half-1)].  t: f32 [M]; out: f32 [M, N].
  virtual Status time_embedding(const TensorView& t, const TensorView& out) = 0;

  // Elementwise dtype conversion with the rounding rules of core/dtype.h.
  //   src, dst: same shape, any float dtypes; rows may be strided.
  virtual Status convert(const TensorView& src, const TensorView& dst) = 0;

  // Full (bidirectional, unmasked) attention of queries against all keys, walking the
  // keys in tiles of p.kv_tile, in order (DESIGN.md §1.2). Per (query, head), fp32 state:
  //   m = -inf, l = 0, acc[Dh] = 0
  //   for each tile T (keys [t0, t1)):
  //     s_j = scale * dot(q, k_j)                     (fp32, backend-documented order)
  //     m_new = max(m, max_j s_j); alpha = exp(m - m_new)   (alpha = 0 when m = -inf)
  //     p_j = exp(s_j - m_new)
  //     l = l * alpha + sum_j p_j                      (fp32, j ascending)
  //     acc = acc * alpha + sum_j bf16(p_j) * v_j      (P rounded to bf16, as FlashAttention-2)
  //     m = m_new
  //   out = bf16(acc / l)
  //   q: bf16 [Mq, H, Dh]; k, v: bf16 [Mk, H, Dh] (strided); out: bf16 [Mq, H, Dh].
  //   p.state: streamed keys in chunks carrying the fp32 state (see AttentionParams).
  virtual Status attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                           const AttentionParams& p) = 0;

  // ---- INT8 attention (AttentionAlgorithm::int8; docs/int8-attention.md, the contract v3) ----
  // Per block: key statistics accumulated per absolute statistics block of kInt8StatBlock
  // keys (max/min: exact, any slicing), each key prepared once its own block's statistics
  // (and block 0's) are complete (per chunk of keys or all at once: nothing else crosses
  // keys), then attention of query slices against the prepared keys (streamed chunks carry
  // the fp32 state exactly as attention() does).
  //   int8_key_stats: k, v bf16 [n, H, Dh] (strided rows) = keys [k0, k0 + n) of the sequence;
  //          stats f32 [2 + NB, H, Dh] (contiguous): [0] kmax, [1] kmin over the keys of
  //          block 0 (keys < kInt8StatBlock), [2 + b] max |v| over the keys of block b.
  //          reset: every entry initialised (-inf, +inf, 0) before this call's keys merge in;
  //          else they merge into the previous values. Keys past block NB - 1 are an error.
  //   int8_prepare: k, v bf16 [n, H, Dh] = keys [keys.k0, keys.k0 + n); stats complete for
  //          block 0's K and for the V of every block from the one before keys.k0's to the
  //          one of the last key; writes keys.k8, keys.sk, keys.v8t (columns [0, n)) and
  //          keys.vs rows of the blocks of these keys (sv_b, rho_b: functions of stats alone).
  //          Whole key groups (contract v4): keys.k0 % kInt8KeyGroupTile == 0 (else
  //          invalid_argument), and the keys end at a multiple of kInt8KeyGroupTile or at the
  //          sequence's last key (the caller's duty: a backend does not know S).
  //   attention_int8: q bf16 [Mq, H, Dh], out bf16 [Mq, H, Dh]; keys: Int8Keys of the n keys
  //          of this call; p: kv_tile (<= kInt8MaxKvTile; dividing kInt8StatBlock, with
  //          keys.k0 a multiple of it, where the keys cross a block boundary), scale,
  //          state/state_in/finalize as for attention() (non-final chunks a multiple of
  //          kv_tile keys; a sequence's calls in ascending key order), except that a
  //          non-final call may leave per-row scratch in `out` for the next call of the same
  //          sequence (the Hopper kernel's q8 cache, docs/int8-attention.md §7a): pass every
  //          call of a streamed sequence the same q and the same out, untouched between calls.
  // The base implementations return unsupported naming the backend.
  virtual Status int8_key_stats(const TensorView& k, const TensorView& v, const TensorView& stats, int64_t k0,
                                bool reset);
  virtual Status int8_prepare(const TensorView& k, const TensorView& v, const TensorView& stats,
                              const Int8Keys& keys);
  virtual Status attention_int8(const TensorView& q, const Int8Keys& keys, const TensorView& out,
                                const AttentionParams& p);

  // ---- linears in a stored weight format (issue 14; docs/numerics.md, quantised linears) ----
  // Scratch: every format's temporaries (quantised activation rows, per-row scales, int32
  // accumulators) come from the backend's workspace (workspace_bytes / set_workspace), a
  // constant of the backend: a backend processes the M rows in row chunks of its own fixed
  // size, which changes no bit because every format below is row-independent.
  //
  // out = linear(x, w) (+ bias), by w.format:
  //   bf16 / f32 weights: exactly gemm(x, w.w, bias, out)  (the base implementation).
  //   int8_convrot ("LS-int8", comfyui-and-quantized-weights.md §2.6), per row r of x [M, K]:
  //     v     = the fp32 fast Hadamard transform of each group of G = w.group inputs: radix-4
  //             stages with strides 1, 4, 16 (, 64 for G = 256) in that order; element i of a
  //             stage of stride s, digit d = (i/s) % 4, base b = i - d*s, is fl32(0.5 * t), t
  //             the left-to-right fp32 sum of +-x[b], +-x[b+s], +-x[b+2s], +-x[b+3s] with the
  //             signs of h4 row d (0: + + + -, 1: + + - +, 2: + - + +, 3: - + + +); no rounding
  //             (with opts.swiglu_input the input of the FHT is a = fl32(fl32(g/fl32(1+exp(-g)))*u),
  //             g, u the halves of x [M, 2K], unrounded)
  //     sx[r] = max(fl32(min(max|v|, bf16_max) * fl32(1/127)), 1e-30)
  //     q     = clamp(rint(bf16(fl32(bf16(v) / bf16(sx[r])))), -128, 127)   (IEEE division)
  //     acc   = sum_k q[r,k] * w.w[n,k] in int32 (exact: any order)
  //     y     = bf16(fl32(fl32(float(acc) * sx[r]) * w.scale[n]))  (+ bias: fl32(. + float(bias)))
  //   fp8_e4m3: s_a = w.input_scale, or per row fl32(max|x_r| / 448) with w.dynamic_act;
  //     q = e4m3_rn_sat(clamp(s_a == 1 ? x : fl32(x / s_a), -448, 448)) (IEEE division);
  //     acc = fp32 sum of exact e4m3 products in a fixed k order that does not depend on M
  //     (the backend documents it); y = bf16(fl32(acc * fl32(s_a * w.scale[0]))) (+ bias).
  //     Backends without fp8 tensor cores may instead dequantise (fl32(e4m3(w)) * s_w, rounded
  //     to bf16) and run gemm on bf16(x): other bits, recorded in Numerics by the backend.
  //   x: bf16 [M, K] (row-strided); w: see LinearWeight; bias: null or f32|bf16 [N];
  //   out: bf16 [M, N]. Formats a backend cannot run return unsupported naming the format.
  virtual Status linear(const TensorView& x, const LinearWeight& w, const TensorView* bias, const TensorView& out,
                        const LinearOptions& opts = {});

  // ---- the LoRA side path of a quantised linear (issue 17; docs/numerics.md) ----------
  // In place, per row m of out [M, N] (after linear() wrote it), with a_k the layer's input
  // (bf16 x widened; with opts.swiglu_input the int8 fused input lq_swiglu(g_k, u_k), fp32,
  // unrounded, exactly what the int8 linear's FHT reads):
  //   t_r = fp32 sum over k = 0, 1, ..., K-1 (ascending) of fl32(a_k * down[k, r])   (t = 0 first)
  //   y_n = fp32 sum over r = 0, 1, ..., R-1 (ascending) of fl32(t_r * up[n, r])     (y = 0 first)
  //   out[m, n] = bf16( fl32(float(out[m, n]) + y_n) )
  // Every product and sum is one IEEE fp32 operation, no FMA: the order depends only on K
  // and R, never on M, the slice or the thread split (row-independent, tested by memcmp).
  //   x: bf16 [M, K] (or [M, 2K] with swiglu_input; row-strided); side: see LoraSide (up may
  //   be a row slice); out: bf16 [M, N] (row-strided). R in 1..kLoraSideMaxRank.
  // No scratch: the CPU keeps t on the stack, CUDA in shared memory of a row block.
  virtual Status lora_side(const TensorView& x, const LoraSide& side, const TensorView& out,
                           const LinearOptions& opts = {});

  // ---- checks --------------------------------------------------------------------
  // The number of elements of t that are NaN, +inf or -inf (a value whose exponent bits
  // are all ones), returned to the host. Reads the bits only: no arithmetic, so the
  // count is exact and no output of any op changes. Synchronous: it runs after every
  // earlier op on the compute queue and the host blocks until the count is known (the
  // engine calls it once per half block: one read of the residual, cheap next to the
  // block's GEMMs).
  //   t: bf16|f16|f32 of 0..4 dims on this backend's device (any strides; an empty
  //   view or a zero-size dimension counts 0). Other dtypes return unsupported.
  virtual Expected<int64_t> count_nonfinite(const TensorView& t) = 0;

  // ---- latent packing (issue 13: the target latents stay on the device) ------------
  // The target video / audio latents to fp32 patch rows and the head rows back to
  // latents (h3-model.md §2.2). Pure data movement plus the model's bf16 rounding
  // points; every element is computed alone, so rows [r0, r0 + n) give the bytes of a
  // call over all rows. The CPU ops (src/backend/cpu/pack.cpp) are the host path the
  // engine takes for host latents; the base implementations return unsupported.
  //
  // Video patch rows, rounded to bf16 as ComfyUI casts the sampler's state:
  //   out[r, 4c + 2p + q] = bf16(lat[c, t, 2i + p, 2j + q]) as f32, for patch row
  //   r0 + r = (t * Hl/2 + i) * Wl/2 + j (Hl, Wl even).
  //   lat: f32|bf16 [C, T, Hl, Wl], any strides >= 0; out: f32 [n, 4C] (row-strided).
  virtual Status pack_video_rows(const TensorView& lat, int64_t r0, const TensorView& out);
  // Audio rows (channel-major stereo), the carry applied as ComfyUI's forward does:
  //   out[r, c] = bf16(bf16(lat[c, ch, j]) * carry) for r0 + r = ch * A + j.
  //   lat: f32|bf16 [C, 2, A], any strides >= 0; out: f32 [n, C] (row-strided);
  //   carry: a bf16 value (1 when the audio is not carried).
  virtual Status pack_audio_rows(const TensorView& lat, float carry, int64_t r0, const TensorView& out);
  // Head rows -> velocities in ComfyUI's sign, the masks applied (one rounding each):
  //   v = -bf16(rows[r, 4c + 2p + q]); with a mask: v = bf16(v * mask[r]);
  //   out[c, t, 2i + p, 2j + q] = v (f32, or bf16: v is a bf16 value, stored exactly),
  //   for patch row r0 + r as in pack_video_rows.
  //   rows: f32 [n, 4C] (row-strided); mask: empty or f32 [n] (the pooled value of each
  //   row); out: f32|bf16 [C, T, Hl, Wl] contiguous (the whole latent).
  virtual Status unpack_video_rows(const TensorView& rows, const TensorView& mask, int64_t r0, const TensorView& out);
  // The audio carry of the output (h3-model.md §2.2 step 6), every op a bf16 op:
  //   a_in = bf16(bf16(src[c, ch, j]) * carry)          (the carried input, as packed)
  //   v    = bf16(bf16(one_minus_s * a_in) + bf16(coef * v))
  struct AudioCarryOut {
    bool apply = false;
    float carry = 1.0f, one_minus_s = 0.0f, coef = 1.0f;
    TensorView src;  // the target audio input f32|bf16 [C, 2, A], any strides, on this device
  };
  // Audio head rows -> velocities: v = -bf16(rows[r, c]); with a mask v = bf16(v * mask[r]);
  // then the carry when c.apply; out[c, ch, j] = v for r0 + r = ch * A + j.
  //   rows: f32 [n, C] (row-strided); mask: empty or f32 [n]; out: f32|bf16 [C, 2, A] contiguous.
  virtual Status unpack_audio_rows(const TensorView& rows, const TensorView& mask, const AudioCarryOut& c, int64_t r0,
                                   const TensorView& out);
};

inline Status Backend::int8_key_stats(const TensorView&, const TensorView&, const TensorView&, int64_t, bool) {
  return make_error(ErrorCode::unsupported, name() + " has no int8 attention");
}
inline Status Backend::int8_prepare(const TensorView&, const TensorView&, const TensorView&, const Int8Keys&) {
  return make_error(ErrorCode::unsupported, name() + " has no int8 attention");
}
inline Status Backend::attention_int8(const TensorView&, const Int8Keys&, const TensorView&, const AttentionParams&) {
  return make_error(ErrorCode::unsupported, name() + " has no int8 attention");
}

// ---- INT8 attention helpers (src/backend/attention_int8.cpp; docs/int8-attention.md §5) ----
// Contract v4's rule for an int8_prepare call: its first key keys.k0 is a multiple of
// kInt8KeyGroupTile (K's scale groups lie in 128-key tiles), else invalid_argument naming k0.
// Every backend calls it before writing anything, so the rule and message agree.
Status check_int8_prepare_start(const Int8Keys& keys);
// Bytes of one Int8Keys' per-key parts of n keys (ld = round_up(n, 64)): k8 | sk | v8t, each
// part 256-byte aligned. Carve them from a buffer of that many bytes with int8_keys_view.
int64_t int8_keys_bytes(int64_t n, int64_t H, int64_t Dh);
// The per-key views of an Int8Keys of n keys in `bytes` (>= int8_keys_bytes(n, H, Dh),
// 256-byte aligned), with the sequence's V-scale table `vs` and first key k0.
Int8Keys int8_keys_view(void* bytes, int64_t n, int64_t H, int64_t Dh, Device dev, const TensorView& vs,
                        int64_t k0 = 0);
// Bytes of the statistics f32 [2 + NB, H, Dh] and of the V-scale table f32 [NB, 2, H, Dh] of a
// sequence of S keys (NB = int8_stat_blocks(S)).
inline int64_t int8_stats_bytes(int64_t S, int64_t H, int64_t Dh) { return (2 + int8_stat_blocks(S)) * H * Dh * 4; }
inline int64_t int8_vscale_bytes(int64_t S, int64_t H, int64_t Dh) { return int8_stat_blocks(S) * 2 * H * Dh * 4; }
// The views of the statistics and the V-scale table in `bytes` (u8, >= int8_tables_bytes(S, H,
// Dh), 256-byte aligned): stats first, then vs.
int64_t int8_tables_bytes(int64_t S, int64_t H, int64_t Dh);
std::pair<TensorView, TensorView> int8_tables_view(void* bytes, int64_t S, int64_t H, int64_t Dh, Device dev);
// Scratch bytes of attention_int8_all over Mk keys: the tables and one Int8Keys of Mk keys.
int64_t int8_all_scratch_bytes(int64_t Mk, int64_t H, int64_t Dh);
// INT8 attention of q against all keys k, v in one call (the stock path, the text refiner):
// int8_key_stats (k0 0, reset), int8_prepare, attention_int8. scratch: a device buffer of at least
// int8_all_scratch_bytes(Mk, H, Dh) bytes (u8, 256-byte aligned). Same shapes as attention().
Status attention_int8_all(Backend& be, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionParams& p, const TensorView& scratch);
// The attention the numerics chose, over all keys in one call: attention_int8_all when
// be.numerics().attention is int8 (scratch needed: int8_all_scratch_bytes), else
// be.attention(q, k, v, out, p) (scratch unused, may be empty).
Status attention_all_keys(Backend& be, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionParams& p, const TensorView& scratch);

// The latent packing ops' base implementations (a backend without them cannot take
// latents on its device; the engine then keeps them on the host).
inline Status Backend::pack_video_rows(const TensorView&, int64_t, const TensorView&) {
  return make_error(ErrorCode::unsupported, name() + ": pack_video_rows is not implemented");
}
inline Status Backend::pack_audio_rows(const TensorView&, float, int64_t, const TensorView&) {
  return make_error(ErrorCode::unsupported, name() + ": pack_audio_rows is not implemented");
}
inline Status Backend::unpack_video_rows(const TensorView&, const TensorView&, int64_t, const TensorView&) {
  return make_error(ErrorCode::unsupported, name() + ": unpack_video_rows is not implemented");
}
inline Status Backend::unpack_audio_rows(const TensorView&, const TensorView&, const AudioCarryOut&, int64_t,
                                         const TensorView&) {
  return make_error(ErrorCode::unsupported, name() + ": unpack_audio_rows is not implemented");
}
// The one place a linear of the model runs: be.linear(x, w, bias, out, opts), then, when
// w carries a LoRA side path, be.lora_side(x, w.lora, out, opts) (src/backend/linear.cpp).
// Every call site of the model's linears (h3 blocks, AdaLN) goes through it.
Status linear_lora(Backend& be, const TensorView& x, const LinearWeight& w, const TensorView* bias,
                   const TensorView& out, const LinearOptions& opts = {});
// The argument checks every backend's lora_side shares (src/backend/linear.cpp): dtypes and
// rank limits return a Status (unsupported / invalid_argument), shape mismatches LS_CHECK.
Status check_lora_side_args(const char* who, const TensorView& x, const LoraSide& side, const TensorView& out,
                            const LinearOptions& opts);

// The CPU backend (always present).
std::unique_ptr<Backend> make_cpu_backend();

// Backend by name: "cpu", "cuda", "cuda:N". Fails with a clear message when the build
// has no CUDA or the device is absent. Implemented in src/backend/registry.cpp, the one
// file that tests LAYERSTREAM_CUDA.
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name);
// The same, then set_numerics(n, d): fails with set_numerics's message when the backend
// cannot honour n.
Expected<std::unique_ptr<Backend>> make_backend(const std::string& name, const Numerics& n, const Diagnostics& d);

}  // namespace ls
