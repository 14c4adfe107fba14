// One H3 DiT block at real width (D = 5376, H = 56, Dh = 128, F = 14336) with
// synthetic weights, through the backend ops only (h3-model.md §2.9-2.11), on the
// CUDA backend (or any backend given with --device):
//   stock:  one slice of S rows (the plain PyTorch-order block);
//   sliced: pass 1 computes K, V for all tokens (qkv weight rows [I, 3I) alone), pass 2
//           walks slices of --slice tokens: Q (rows [0, I)), attention against all
//           keys, out_proj, gated add; then the MLP per slice. With attention int8
//           the keys' statistics and int8 form are made once between the passes.
// Reports per S: median block time (ms) over --iters after --warmup, peak arena bytes
// of each mode, attention and GEMM TFLOP/s measured alone, and whether the sliced
// residual equals the stock one byte for byte. Timing: backend synchronize() around
// each timed region plus a steady clock (regions are tens of ms and up, so this is as
// good as device events and keeps this file free of CUDA headers). JSON out.
//
// Usage: bench_cuda_block [--device cuda] [--S 32768,111274] [--slice 8192]
//                         [--iters 3] [--warmup 1] [--kv-tile N (default: the backend's, 8192 with cuDNN)] [--json out.json]
//                         [--attention-only | --gemm-only] [--dump DIR] [--op-times] [--attention A]
//   --attention A     auto | native | cudnn | hopper | int8: the attention algorithm (a numerics
//                     setting, recorded in the JSON); overrides LAYERSTREAM_ATTENTION.
//   --op-times        one more stock block, synchronised after every op: each op's
//                     device time (JSON "op_ms"; the ops' labels, e.g. "qkv", "attention").
//   --attention-only  attention alone (full S); no block, weights not filled.
//   --gemm-only       the four GEMMs alone (M = min(S, 16384) rows), TFLOP/s printed;
//                     the algorithm is pinned once per process, so sweep
//                     LAYERSTREAM_GEMM_CANDIDATE=i with one process per i.
// Numerics: the developer variables (LAYERSTREAM_ATTENTION, _ATTN_VARIANT, _GEMM_CANDIDATE,
// _CUDNN_QCHUNK, ...: src/backend/numerics.h apply_developer_variables) are read here
// and handed to the backend with set_numerics; the JSON records the resolved numerics.
//   --dump DIR        x0 gets S independent random rows (without --dump, 4096 rows are
//                     repeated: fast set-up, but repeated rows would let an error test
//                     pass on few distinct rows), and the block's exact weights, inputs
//                     and stock output go to DIR for bench/pytorch_block.py --from DIR
//                     (error against an fp64 reference, DESIGN.md §4):
//     DIR/weights.safetensors (once)
//       norm1, norm2  bf16 [D]          rms_norm weights before attention / MLP
//       q_norm, k_norm bf16 [Dh]        per-head q/k RMSNorm weights
//       qkv           bf16 [3I, D]      rows [0, I) q, [I, 2I) k, [2I, 3I) v (F.linear layout)
//       out           bf16 [D, I]
//       fc1           bf16 [2F, D]      rows [0, F) gate (silu), [F, 2F) up
//       fc2           bf16 [D, F]
//       table         bf16 [3, 6D]      AdaLN rows; columns [cD, (c+1)D) = chunk c of
//                                       (shift_msa, scale_msa, gate_msa, shift_mlp,
//                                       scale_mlp, gate_mlp)
//     DIR/io_S<S>.safetensors (per S)
//       rows  i32 [S]        table row of each token (1 video, 2 for the last S/100 rows)
//       x0    bf16 [S, D]    residual in
//       rope  bf16 [S, 48, 2] (cos, sin) of pair j: dims j and j + 48 of every q/k head
//                            (split-half within the first 96 dims; 96..127 unrotated)
//       y     bf16 [S, D]    residual after one stock block
//     Block math (the backend ops' contracts, backend.h): h = modulate(rms_norm(x, norm1),
//     shift = chunk 0, scale = chunk 1); q, k = qk_norm_rope(qkv(h)); x += out(attention)
//     * chunk 2; h = modulate(rms_norm(x, norm2), chunk 3, chunk 4); x += fc2(swiglu(fc1(h)))
//     * chunk 5; chunks taken at table row rows[m]; eps 1e-5; softmax scale 1/sqrt(128).
//     Tensors stream from the device in pieces of 4096 residual rows (44 MB of host
//     memory at any S); each file is written to a temporary and renamed when complete.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "bench_json.h"
#include "core/arena.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"

namespace {

using namespace ls;

constexpr int64_t D = 5376, H = 56, Dh = 128, I = H * Dh, F = 14336, P = 48;

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "bench_cuda_block: %s\n", m.c_str());
  std::exit(1);
}
// --op-times: while `on`, every ok() after an op waits for the device and charges the
// time since the previous mark to that op's label, so one extra stock block gives each
// op's device time (plus ~10-20 us of launch and synchronisation per op: the ops here
// take 1-600 ms each at S = 111k).
struct OpTimes {
  bool on = false;
  Backend* b = nullptr;
  std::chrono::steady_clock::time_point mark;
  std::map<std::string, double> ms;
} g_op_times;

void ok(const Status& s, const char* what) {
  if (!s.ok()) die(std::string(what) + ": " + s.message());
  if (g_op_times.on) {
    g_op_times.on = false;  // the synchronize below reports through ok() too
    const Status sy = g_op_times.b->synchronize();
    if (!sy.ok()) die("sync: " + sy.message());
    const auto now = std::chrono::steady_clock::now();
    g_op_times.ms[what] += std::chrono::duration<double, std::milli>(now - g_op_times.mark).count();
    g_op_times.mark = now;
    g_op_times.on = true;
  }
}
TensorView take(Arena& a, DType t, std::initializer_list<int64_t> dims, const char* what) {
  auto r = a.alloc(t, dims, what);
  if (!r.ok()) die(r.error().message);
  return r.value();
}

// Fills a device view with N(0, sd) + mean values, generated on the host in chunks.
// Views of more than 4096 rows get 4096 random rows repeated (device copies), which
// keeps set-up time low at S = 111k; timings do not depend on the values.
void fill_random(Backend& b, const TensorView& v, uint32_t seed, float sd, float mean);
void fill(Backend& b, const TensorView& v, uint32_t seed, float sd, float mean = 0.0f) {
  constexpr int64_t kRows = 4096;
  if (v.ndim < 2 || v.rows() <= kRows || !v.is_contiguous()) return fill_random(b, v, seed, sd, mean);
  fill_random(b, v.slice_rows(0, kRows), seed, sd, mean);
  for (int64_t a = kRows; a < v.rows(); a += kRows) {
    const int64_t e = std::min(v.rows(), a + kRows);
    ok(b.copy(v.slice_rows(a, e), v.slice_rows(0, e - a)), "replicate");
  }
  ok(b.synchronize(), "sync");
}
void fill_random(Backend& b, const TensorView& v, uint32_t seed, float sd, float mean) {
  const int64_t n = v.numel();
  const int64_t chunk = int64_t{1} << 22;
  std::vector<uint8_t> host(static_cast<size_t>(std::min(n, chunk) * v.elem_size()));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  TensorView flat = v;
  flat.ndim = 1;
  flat.shape[0] = n;
  flat.stride[0] = 1;
  for (int64_t i = 0; i < n; i += chunk) {
    const int64_t m = std::min(chunk, n - i);
    for (int64_t j = 0; j < m; ++j) store_from_f32(host.data(), v.dtype, j, mean + sd * nd(rng));
    TensorView dst = flat;
    dst.data = static_cast<char*>(v.data) + i * v.elem_size();
    dst.shape[0] = m;
    ok(b.copy(dst, TensorView(host.data(), v.dtype, {m})), "upload");
  }
  ok(b.synchronize(), "sync");
}

// Fills a contiguous device view [R, ...] with N(0, sd) + mean values, every row its
// own draws (row r: mt19937 seeded with seed_seq{seed, r}, so the values do not depend
// on the thread count), generated on the thread pool in pieces of 4096 rows. R x (row
// size) normal draws: seconds at S = 111k, so only --dump uses it.
void fill_rows_random(Backend& b, const TensorView& v, uint32_t seed, float sd, float mean = 0.0f) {
  LS_CHECK(v.is_contiguous() && v.ndim >= 2);
  constexpr int64_t kRows = 4096;
  const int64_t n = v.numel() / v.rows();  // elements per row
  std::vector<uint8_t> host(static_cast<size_t>(std::min(v.rows(), kRows) * n * v.elem_size()));
  for (int64_t a = 0; a < v.rows(); a += kRows) {
    const int64_t e = std::min(v.rows(), a + kRows);
    parallel_for(e - a, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        std::seed_seq ss{seed, static_cast<uint32_t>(a + r)};
        std::mt19937 rng(ss);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (int64_t j = 0; j < n; ++j) store_from_f32(host.data(), v.dtype, r * n + j, mean + sd * nd(rng));
      }
    });
    const TensorView dst = v.slice_rows(a, e);
    ok(b.copy(dst, TensorView::contiguous(host.data(), v.dtype, dst.shape.data(), dst.ndim)), "upload");
    ok(b.synchronize(), "sync");  // host is refilled next
  }
}

// Streams contiguous device views into one safetensors file (declared in the given
// order, so i32/bf16 only: each starts aligned when 4-byte tensors come first), in
// pieces of at most 4096 residual rows (44 MB) through one host buffer. Prints the
// path and size.
struct DumpTensor {
  const char* name;
  TensorView v;
};
void dump_file(Backend& b, const std::string& path, const std::vector<DumpTensor>& ts,
               const std::map<std::string, std::string>& meta) {
  constexpr int64_t kPieceBytes = 4096 * D * 2;
  SafetensorsWriter wr(path);
  for (const auto& [k, v] : meta) wr.set_metadata(k, v);
  for (const DumpTensor& t : ts) {
    LS_CHECK(t.v.is_contiguous());
    ok(wr.declare(t.name, t.v.dtype, std::vector<int64_t>(t.v.shape.begin(), t.v.shape.begin() + t.v.ndim)), "dump");
  }
  ok(wr.begin(), "dump");
  std::vector<uint8_t> host;
  for (const DumpTensor& t : ts) {
    const int64_t row_bytes = t.v.nbytes() / std::max<int64_t>(1, t.v.rows());
    const int64_t piece = std::max<int64_t>(1, kPieceBytes / std::max<int64_t>(1, row_bytes));
    host.resize(static_cast<size_t>(std::min(t.v.rows(), piece) * row_bytes));
    for (int64_t a = 0; a < t.v.rows(); a += piece) {
      const TensorView src = t.v.slice_rows(a, std::min(t.v.rows(), a + piece));
      ok(b.copy(TensorView::contiguous(host.data(), src.dtype, src.shape.data(), src.ndim), src), "download");
      ok(b.synchronize(), "sync");
      ok(wr.write(host.data(), static_cast<size_t>(src.nbytes())), "dump");
    }
  }
  ok(wr.commit(), "dump");
  std::printf("dump: %s (%s)\n", path.c_str(), format_bytes(std::filesystem::file_size(path)).c_str());
  std::fflush(stdout);
}

struct Weights {
  TensorView norm1, norm2, qn, kn;  // bf16 [D], [D], [Dh], [Dh]
  TensorView qkv, out, fc1, fc2;    // bf16 [3I, D], [D, I], [2F, D], [D, F]
  TensorView table;                 // bf16 [3, 6D]: AdaLN rows (shift, scale, gate) x (msa, mlp)
};

struct Inputs {
  TensorView x;     // bf16 [S, D] residual
  TensorView rows;  // i32 [S] AdaLN table row per token
  TensorView rope;  // bf16 [S, P, 2]
};

TensorView chunk(const Weights& w, int c) { return w.table.cols(c * D, (c + 1) * D); }  // bf16 [3, D]

// h = modulate(rms_norm(x)) for rows of x (in place in h).
// Attention over all keys: attention int8 (issue 26) runs its statistics + prepare + attention
// through attention_all_keys with scratch from the arena (as the engine's stock path), every
// other algorithm b.attention.
void attend(Backend& b, Arena& ar, const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
            const AttentionParams& ap) {
  if (b.numerics().attention != AttentionAlgorithm::int8) {
    ok(b.attention(q, k, v, o, ap), "attention");
    return;
  }
  Arena::Scope s(ar);
  TensorView scratch = take(ar, DType::u8, {int8_all_scratch_bytes(k.size(0), k.size(1), k.size(2))}, "int8 scratch");
  ok(attention_all_keys(b, q, k, v, o, ap, scratch), "attention int8");
}

void norm_mod(Backend& b, const Weights& w, const TensorView& x, const TensorView& rows, const TensorView& norm_w,
              int shift_chunk, const TensorView& h) {
  ok(b.rms_norm_modulate(x, norm_w, 1e-5f, chunk(w, shift_chunk), chunk(w, shift_chunk + 1), rows, h),
     "rms_norm_modulate");
}

// The MLP half for rows [a, b) of x.
void mlp_rows(Backend& b, Arena& ar, const Weights& w, const Inputs& in, int64_t a, int64_t e) {
  Arena::Scope s(ar);
  const int64_t c = e - a;
  TensorView x = in.x.slice_rows(a, e), rows = in.rows.slice_rows(a, e);
  TensorView h = take(ar, DType::bf16, {c, D}, "mlp h");
  norm_mod(b, w, x, rows, w.norm2, 3, h);
  TensorView u = take(ar, DType::bf16, {c, 2 * F}, "fc1 out");
  ok(b.gemm(h, w.fc1, nullptr, u), "fc1");
  TensorView sw = take(ar, DType::bf16, {c, F}, "swiglu");
  ok(b.swiglu(u, sw), "swiglu");
  ok(b.gemm(sw, w.fc2, nullptr, h), "fc2");  // h reused as the fc2 output
  ok(b.gated_add(x, h, chunk(w, 5), rows), "gated_add mlp");
}

void block_stock(Backend& b, Arena& ar, const Weights& w, const Inputs& in, const AttentionParams& ap) {
  Arena::Scope s(ar);
  const int64_t S = in.x.rows();
  {
    Arena::Scope s2(ar);
    TensorView h = take(ar, DType::bf16, {S, D}, "h");
    norm_mod(b, w, in.x, in.rows, w.norm1, 0, h);
    TensorView qkv = take(ar, DType::bf16, {S, 3 * I}, "qkv");
    ok(b.gemm(h, w.qkv, nullptr, qkv), "qkv");
    TensorView q = qkv.cols(0, I).unflatten_last(H, Dh), k = qkv.cols(I, 2 * I).unflatten_last(H, Dh),
               v = qkv.cols(2 * I, 3 * I).unflatten_last(H, Dh);
    ok(b.qk_norm_rope(q, w.qn, in.rope, 1e-5f), "q norm");
    ok(b.qk_norm_rope(k, w.kn, in.rope, 1e-5f), "k norm");
    TensorView o = take(ar, DType::bf16, {S, H, Dh}, "attn out");
    attend(b, ar, q, k, v, o, ap);
    ok(b.gemm(o.flatten_last2(), w.out, nullptr, h), "out_proj");
    ok(b.gated_add(in.x, h, chunk(w, 2), in.rows), "gated_add msa");
  }
  mlp_rows(b, ar, w, in, 0, S);
}

void block_sliced(Backend& b, Arena& ar, const Weights& w, const Inputs& in, const AttentionParams& ap, int64_t c) {
  Arena::Scope s(ar);
  const int64_t S = in.x.rows();
  TensorView kv = take(ar, DType::bf16, {S, 2 * I}, "kv");
  TensorView k = kv.cols(0, I).unflatten_last(H, Dh), v = kv.cols(I, 2 * I).unflatten_last(H, Dh);
  // Pass 1: K and V of every token (the residual is not touched).
  for (int64_t a = 0; a < S; a += c) {
    Arena::Scope s2(ar);
    const int64_t e = std::min(S, a + c);
    TensorView h = take(ar, DType::bf16, {e - a, D}, "h");
    norm_mod(b, w, in.x.slice_rows(a, e), in.rows.slice_rows(a, e), w.norm1, 0, h);
    ok(b.gemm(h, w.qkv.slice_rows(I, 3 * I), nullptr, kv.slice_rows(a, e)), "kv proj");
    ok(b.qk_norm_rope(k.slice_rows(a, e), w.kn, in.rope.slice_rows(a, e), 1e-5f), "k norm");
  }
  // attention int8: the key statistics and the prepared keys once, after pass 1, as the
  // executor's two-pass attention does (attention_all_keys per slice would prepare all
  // keys again for every slice: session 12's run 10 timed that, 15.5 ms a slice).
  const bool int8 = b.numerics().attention == AttentionAlgorithm::int8;
  Int8Keys keys;
  if (int8) {
    const TensorView sb = take(ar, DType::f32, {2 + int8_stat_blocks(S), H, Dh}, "int8 stats");
    const TensorView vs = take(ar, DType::f32, {int8_stat_blocks(S), 2, H, Dh}, "int8 V scales");
    const TensorView kb = take(ar, DType::u8, {int8_keys_bytes(S, H, Dh)}, "int8 keys");
    keys = int8_keys_view(kb.data, S, H, Dh, kb.device, vs);
    ok(b.int8_key_stats(k, v, sb, /*k0=*/0, /*reset=*/true), "int8 stats");
    ok(b.int8_prepare(k, v, sb, keys), "int8 prepare");
  }
  // Pass 2: per slice Q, attention over all keys, out_proj, gated add.
  for (int64_t a = 0; a < S; a += c) {
    Arena::Scope s2(ar);
    const int64_t e = std::min(S, a + c), n = e - a;
    TensorView x = in.x.slice_rows(a, e), rows = in.rows.slice_rows(a, e);
    TensorView h = take(ar, DType::bf16, {n, D}, "h");
    norm_mod(b, w, x, rows, w.norm1, 0, h);
    TensorView q = take(ar, DType::bf16, {n, H, Dh}, "q");
    ok(b.gemm(h, w.qkv.slice_rows(0, I), nullptr, q.flatten_last2()), "q proj");
    ok(b.qk_norm_rope(q, w.qn, in.rope.slice_rows(a, e), 1e-5f), "q norm");
    TensorView o = take(ar, DType::bf16, {n, H, Dh}, "attn out");
    if (int8) ok(b.attention_int8(q, keys, o, ap), "attention int8");
    else attend(b, ar, q, k, v, o, ap);
    ok(b.gemm(o.flatten_last2(), w.out, nullptr, h), "out_proj");
    ok(b.gated_add(x, h, chunk(w, 2), rows), "gated_add msa");
  }
  for (int64_t a = 0; a < S; a += c) mlp_rows(b, ar, w, in, a, std::min(S, a + c));
}

double seconds_of(Backend& b, const std::function<void()>& f) {
  ok(b.synchronize(), "sync");
  auto t0 = std::chrono::steady_clock::now();
  f();
  ok(b.synchronize(), "sync");
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> r;
  size_t p = 0;
  while (p < s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    r.push_back(std::stoll(s.substr(p, q - p)));
    p = q + 1;
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string device = "cuda", json_path, dump_dir;
  std::vector<int64_t> Ss = {32768};
  int64_t slice = 8192, kv_tile = 0;  // 0: the backend's default_kv_tile()
  int iters = 3, warmup = 1;
  bool attention_only = false, gemm_only = false, op_times = false;
  std::string attention;  // empty: the developer variable or the default
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) die("missing value after " + a);
      return argv[++i];
    };
    if (a == "--device") device = next();
    else if (a == "--S") Ss = parse_list(next());
    else if (a == "--slice") slice = std::stoll(next());
    else if (a == "--iters") iters = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--kv-tile") kv_tile = std::stoll(next());
    else if (a == "--json") json_path = next();
    else if (a == "--attention-only") attention_only = true;
    else if (a == "--gemm-only") gemm_only = true;
    else if (a == "--op-times") op_times = true;
    else if (a == "--dump") dump_dir = next();
    else if (a == "--attention") attention = next();
    else die("unknown argument " + a);
  }
  if (attention_only && gemm_only) die("--attention-only and --gemm-only exclude each other");
  if (!dump_dir.empty() && (attention_only || gemm_only)) die("--dump needs the block run (no --attention-only, --gemm-only)");
  const bool run_block = !attention_only && !gemm_only;
  Numerics numerics;
  Diagnostics diagnostics;
  std::vector<std::string> from_env;
  ok(apply_developer_variables([](const char* n) -> const char* { return std::getenv(n); }, &numerics, &diagnostics,
                               &from_env),
     "developer variables");
  for (const std::string& e : from_env) std::fprintf(stderr, "bench_cuda_block: using developer variable %s\n", e.c_str());
  if (!attention.empty()) {
    auto alg = parse_attention(attention);
    if (!alg.ok()) die(alg.error().message);
    numerics.attention = *alg;
  }
  auto be = make_backend(device, numerics, diagnostics);
  if (!be.ok()) die(be.error().message);
  Backend& b = **be;
  // The engine's default for this model: attention auto resolves per head dim (CUDA:
  // hopper at 128 on sm_90), as Session::load_weights does for a loaded model.
  ok(b.set_model_head_dim(Dh), "set_model_head_dim");
  if (kv_tile == 0) kv_tile = b.default_kv_tile();
  std::fprintf(stderr, "bench_cuda_block: numerics %s\n", describe(b.numerics()).c_str());
  const int64_t maxS = *std::max_element(Ss.begin(), Ss.end());
  // Arena: weights + inputs + a stock block at maxS + a saved residual, with slack.
  const size_t weights_bytes = static_cast<size_t>((3 * I * D + D * I + 2 * F * D + D * F + 3 * 6 * D + 2 * D + 2 * Dh) * 2);
  const size_t per_token = static_cast<size_t>((D * 3 /*x, saved, stock result*/ + P * 2 + 2 + D + 3 * I + I + 2 * F + F) * 2 + 4);
  const size_t int8_scratch = b.numerics().attention == AttentionAlgorithm::int8
                                  ? static_cast<size_t>(int8_all_scratch_bytes(maxS, H, Dh))
                                  : 0;  // attend(): the prepared keys of all S
  const size_t capacity = weights_bytes + per_token * static_cast<size_t>(maxS) + int8_scratch + (size_t{1} << 30);
  auto arena_r = Arena::create(b.memory(), capacity);
  if (!arena_r.ok()) die(arena_r.error().message);
  Arena& ar = **arena_r;
  TensorView ws = take(ar, DType::u8, {static_cast<int64_t>(std::max<size_t>(b.workspace_bytes(), 256))}, "workspace");
  ok(b.set_workspace(ws), "set_workspace");

  Weights w;
  w.norm1 = take(ar, DType::bf16, {D}, "norm1");
  w.norm2 = take(ar, DType::bf16, {D}, "norm2");
  w.qn = take(ar, DType::bf16, {Dh}, "q_norm");
  w.kn = take(ar, DType::bf16, {Dh}, "k_norm");
  w.qkv = take(ar, DType::bf16, {3 * I, D}, "qkv_proj");
  w.out = take(ar, DType::bf16, {D, I}, "out_proj");
  w.fc1 = take(ar, DType::bf16, {2 * F, D}, "fc1");
  w.fc2 = take(ar, DType::bf16, {D, F}, "fc2");
  w.table = take(ar, DType::bf16, {3, 6 * D}, "adaln table");
  if (!attention_only) {  // the GEMM timings use the weights too
  fill(b, w.norm1, 1, 0.1f, 1.0f);
  fill(b, w.norm2, 2, 0.1f, 1.0f);
  fill(b, w.qn, 3, 0.1f, 1.0f);
  fill(b, w.kn, 4, 0.1f, 1.0f);
  fill(b, w.qkv, 5, 1.0f / std::sqrt(static_cast<float>(D)));
  fill(b, w.out, 6, 1.0f / std::sqrt(static_cast<float>(I)));
  fill(b, w.fc1, 7, 1.0f / std::sqrt(static_cast<float>(D)));
  fill(b, w.fc2, 8, 1.0f / std::sqrt(static_cast<float>(F)));
  fill(b, w.table, 9, 0.1f);
  }
  const std::string gemm_candidate_text = format_gemm_candidate(b.numerics().gemm_candidate);
  const char* gemm_candidate = gemm_candidate_text.empty() ? nullptr : gemm_candidate_text.c_str();
  std::map<std::string, std::string> dump_meta = {{"producer", "bench/bench_cuda_block.cpp --dump"},
                                                  {"device", b.name()},
                                                  {"kv_tile", std::to_string(kv_tile)},
                                                  {"numerics", describe(b.numerics())}};
  if (gemm_candidate) dump_meta["gemm_candidate"] = gemm_candidate;
  if (!dump_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dump_dir, ec);
    if (ec) die("cannot create " + dump_dir + ": " + ec.message());
    dump_file(b, dump_dir + "/weights.safetensors",
              {{"norm1", w.norm1}, {"norm2", w.norm2}, {"q_norm", w.qn}, {"k_norm", w.kn}, {"qkv", w.qkv},
               {"out", w.out}, {"fc1", w.fc1}, {"fc2", w.fc2}, {"table", w.table}},
              dump_meta);
  }

  nlohmann::json out;
  out["device"] = b.name();
  out["slice_tokens"] = slice;
  out["kv_tile"] = kv_tile;
  out["numerics"] = b.numerics();  // resolved (src/backend/numerics.h to_json)
  out["numerics_from_env"] = from_env;
  out["iters"] = iters;
  out["warmup"] = warmup;
  out["timing"] = "steady_clock around backend synchronize(), median";
  if (gemm_candidate) out["gemm_candidate"] = gemm_candidate;
  if (!dump_dir.empty()) out["dump_dir"] = dump_dir;
  AttentionParams ap;
  ap.kv_tile = kv_tile;

  for (int64_t S : Ss) {
    Arena::Scope scope(ar);
    Inputs in;
    in.x = take(ar, DType::bf16, {S, D}, "x");
    TensorView x0 = take(ar, DType::bf16, {S, D}, "x saved");
    TensorView x_stock = take(ar, DType::bf16, {S, D}, "x stock result");
    in.rows = take(ar, DType::i32, {S}, "rows");
    in.rope = take(ar, DType::bf16, {S, P, 2}, "rope");
    if (run_block && dump_dir.empty()) fill(b, x0, 100 + static_cast<uint32_t>(S), 1.0f);
    if (run_block && !dump_dir.empty()) fill_rows_random(b, x0, 100 + static_cast<uint32_t>(S), 1.0f);
    if (run_block) {
      std::vector<int32_t> r(static_cast<size_t>(S));
      for (int64_t i = 0; i < S; ++i) r[static_cast<size_t>(i)] = i < S - S / 100 ? 1 : 2;  // video rows, audio rows
      ok(b.copy(in.rows, TensorView(r.data(), DType::i32, {S})), "rows");
      std::vector<uint16_t> rp(static_cast<size_t>(S * P * 2));
      for (int64_t i = 0; i < S; ++i)
        for (int64_t j = 0; j < P; ++j) {
          const float ang = static_cast<float>(i % 4096) * std::pow(10000.0f, -static_cast<float>(j % 16) / 16.0f);
          rp[static_cast<size_t>((i * P + j) * 2)] = f32_to_bf16(std::cos(ang));
          rp[static_cast<size_t>((i * P + j) * 2 + 1)] = f32_to_bf16(std::sin(ang));
        }
      ok(b.copy(in.rope, TensorView(rp.data(), DType::bf16, {S, P, 2})), "rope");
      ok(b.synchronize(), "sync");
    }
    nlohmann::json rs;
    rs["S"] = S;
    auto reset = [&]() { ok(b.copy(in.x, x0), "reset x"); };
    if (run_block) {
    // Stock.
    std::vector<double> ts;
    ar.reset_peak();
    const size_t base_used = ar.used();
    for (int i = 0; i < warmup + iters; ++i) {
      reset();
      const double t = seconds_of(b, [&] { block_stock(b, ar, w, in, ap); });
      if (i >= warmup) ts.push_back(t);
    }
    ok(b.copy(x_stock, in.x), "save stock");
    rs["stock_ms"] = median(ts) * 1e3;
    rs["stock_peak_bytes"] = ar.peak() - base_used;
    if (op_times) {
      // One more stock block, synchronised after every op (not part of stock_ms).
      reset();
      ok(b.synchronize(), "sync");
      g_op_times = OpTimes{true, &b, std::chrono::steady_clock::now(), {}};
      block_stock(b, ar, w, in, ap);
      g_op_times.on = false;
      double total = 0;
      for (const auto& [name, t] : g_op_times.ms) total += t;
      std::printf("S=%lld: stock block op by op (synchronised after each), %.1f ms in all:\n", static_cast<long long>(S), total);
      for (const auto& [name, t] : g_op_times.ms) {
        std::printf("  %-16s %8.2f ms  %5.1f %%\n", name.c_str(), t, 100.0 * t / total);
        rs["op_ms"][name] = t;
      }
    }
    // Sliced.
    ts.clear();
    ar.reset_peak();
    for (int i = 0; i < warmup + iters; ++i) {
      reset();
      const double t = seconds_of(b, [&] { block_sliced(b, ar, w, in, ap, slice); });
      if (i >= warmup) ts.push_back(t);
    }
    rs["sliced_ms"] = median(ts) * 1e3;
    rs["sliced_peak_bytes"] = ar.peak() - base_used;
    rs["sliced_over_stock"] = rs["sliced_ms"].get<double>() / rs["stock_ms"].get<double>();
    {
      // Byte comparison of the residual after one block, on the host in chunks.
      const int64_t rows_per = 4096;
      std::vector<uint16_t> ha(static_cast<size_t>(rows_per * D)), hb(ha.size());
      int64_t diff = 0;
      for (int64_t a = 0; a < S; a += rows_per) {
        const int64_t e = std::min(S, a + rows_per);
        TensorView va(ha.data(), DType::bf16, {e - a, D}), vb(hb.data(), DType::bf16, {e - a, D});
        ok(b.copy(va, in.x.slice_rows(a, e)), "download");
        ok(b.copy(vb, x_stock.slice_rows(a, e)), "download");
        ok(b.synchronize(), "sync");
        for (size_t i = 0; i < static_cast<size_t>((e - a) * D); ++i) diff += ha[i] != hb[i];
      }
      rs["sliced_vs_stock_differing_elements"] = diff;
      rs["sliced_equals_stock"] = diff == 0;
    }
    if (!dump_dir.empty()) {
      const std::string path = dump_dir + "/io_S" + std::to_string(S) + ".safetensors";
      auto meta = dump_meta;
      meta["S"] = std::to_string(S);
      dump_file(b, path, {{"rows", in.rows}, {"x0", x0}, {"rope", in.rope}, {"y", x_stock}}, meta);
      rs["dump"] = path;
    }
    }  // run_block
    // Attention alone (full S) and each GEMM alone.
    {
      Arena::Scope s2(ar);
      TensorView qkv = take(ar, DType::bf16, {S, 3 * I}, "qkv");
      fill(b, qkv, 7 + static_cast<uint32_t>(S), 1.0f);
      TensorView o = take(ar, DType::bf16, {S, H, Dh}, "o");
      TensorView q = qkv.cols(0, I).unflatten_last(H, Dh), k = qkv.cols(I, 2 * I).unflatten_last(H, Dh),
                 v = qkv.cols(2 * I, 3 * I).unflatten_last(H, Dh);
      if (!gemm_only) {
      std::vector<double> ta;
      for (int i = 0; i < warmup + iters; ++i) {
        const double t = seconds_of(b, [&] { attend(b, ar, q, k, v, o, ap); });
        if (i >= warmup) ta.push_back(t);
      }
      const double flops = 4.0 * static_cast<double>(S) * static_cast<double>(S) * Dh * H;
      rs["attention_ms"] = median(ta) * 1e3;
      rs["attention_tflops"] = flops / median(ta) / 1e12;
      }
      if (attention_only) {
        std::printf("S=%" PRId64 ": attention %.1f ms %.0f TFLOP/s\n", S, rs["attention_ms"].get<double>(),
                    rs["attention_tflops"].get<double>());
        out["results"].push_back(rs);
        continue;
      }
      struct G {
        const char* name;
        TensorView w;
        int64_t K, N;
      } gs[] = {{"qkv", w.qkv, D, 3 * I}, {"out_proj", w.out, I, D}, {"fc1", w.fc1, D, 2 * F}, {"fc2", w.fc2, F, D}};
      double total_ms = 0;
      const int64_t M = std::min<int64_t>(S, 16384);
      rs["gemm_M"] = M;
      for (const G& g : gs) {
        Arena::Scope s3(ar);
        TensorView xin = qkv.slice_rows(0, M).cols(0, g.K);  // any bf16 data of the right shape
        TensorView xo = take(ar, DType::bf16, {M, g.N}, "gemm out");
        std::vector<double> tg;
        for (int i = 0; i < warmup + iters; ++i) {
          const double t = seconds_of(b, [&] { ok(b.gemm(xin, g.w, nullptr, xo), g.name); });
          if (i >= warmup) tg.push_back(t);
        }
        const double tf = 2.0 * static_cast<double>(M) * g.N * g.K / median(tg) / 1e12;
        rs["gemm_tflops"][g.name] = tf;
        total_ms += 2.0 * static_cast<double>(S) * g.N * g.K / (tf * 1e12) * 1e3;
      }
      rs["gemm_ms_at_S_estimated"] = total_ms;
      if (gemm_only) {
        std::printf("S=%" PRId64 ": gemm (M = %" PRId64 ", LAYERSTREAM_GEMM_CANDIDATE=%s) TFLOP/s qkv %.1f out %.1f "
                    "fc1 %.1f fc2 %.1f, estimated %.1f ms for one block's GEMMs at S\n",
                    S, M, gemm_candidate ? gemm_candidate : "0", rs["gemm_tflops"]["qkv"].get<double>(),
                    rs["gemm_tflops"]["out_proj"].get<double>(), rs["gemm_tflops"]["fc1"].get<double>(),
                    rs["gemm_tflops"]["fc2"].get<double>(), total_ms);
        std::fflush(stdout);
        out["results"].push_back(rs);
        continue;
      }
    }
    std::printf("S=%" PRId64 ": stock %.1f ms, sliced %.1f ms (x%.3f), equal %s, attention %.1f ms %.0f TFLOP/s, "
                "gemm TFLOP/s qkv %.0f out %.0f fc1 %.0f fc2 %.0f, peak stock %s sliced %s\n",
                S, rs["stock_ms"].get<double>(), rs["sliced_ms"].get<double>(), rs["sliced_over_stock"].get<double>(),
                rs["sliced_equals_stock"].get<bool>() ? "yes" : "NO", rs["attention_ms"].get<double>(),
                rs["attention_tflops"].get<double>(), rs["gemm_tflops"]["qkv"].get<double>(),
                rs["gemm_tflops"]["out_proj"].get<double>(), rs["gemm_tflops"]["fc1"].get<double>(),
                rs["gemm_tflops"]["fc2"].get<double>(), format_bytes(rs["stock_peak_bytes"].get<uint64_t>()).c_str(),
                format_bytes(rs["sliced_peak_bytes"].get<uint64_t>()).c_str());
    std::fflush(stdout);
    out["results"].push_back(rs);
  }
  if (!json_path.empty() && !bench::write_json_text(json_path, out.dump(2) + "\n")) die("cannot write " + json_path);
  return 0;
}
