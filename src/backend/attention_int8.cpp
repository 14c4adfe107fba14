// INT8 attention helpers shared by every backend and the executor (backend.h;
// docs/int8-attention.md §5): the byte layout of prepared keys, and the one-call form
// (statistics, prepare, attention over all keys) used by the stock path and the refiner.
#include <string>

#include "backend/backend.h"

namespace ls {

namespace {

constexpr int64_t kAlign = 256;
int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }
int64_t ld_of(int64_t n) { return align_up(n, 64); }

struct Parts {
  int64_t k8, sk, v8t, total;
};
Parts parts(int64_t n, int64_t H, int64_t Dh) {
  Parts p{};
  p.k8 = 0;
  p.sk = align_up(p.k8 + n * H * Dh, kAlign);
  p.v8t = align_up(p.sk + n * H * 4, kAlign);
  p.total = align_up(p.v8t + H * Dh * ld_of(n), kAlign);
  return p;
}

}  // namespace

Int8Keys Int8Keys::slice(int64_t a, int64_t b) const {
  LS_CHECK_MSG(a >= 0 && a <= b && b <= keys() && (a % 16 == 0 || a == b),
               "int8 keys slice [" + std::to_string(a) + ", " + std::to_string(b) + ") of " +
                   std::to_string(keys()) + " keys (the start must be a multiple of 16)");
  Int8Keys s = *this;
  s.k8 = k8.slice_rows(a, b);
  s.sk = sk.slice_rows(a, b);
  s.v8t.data = static_cast<int8_t*>(v8t.data) + a;
  s.v8t.shape[2] = b - a;
  s.k0 = k0 + a;
  return s;
}

int64_t int8_keys_bytes(int64_t n, int64_t H, int64_t Dh) { return parts(n, H, Dh).total; }

Status check_int8_prepare_start(const Int8Keys& keys) {
  if (keys.k0 % kInt8KeyGroupTile == 0) return Status();
  return make_error(ErrorCode::invalid_argument,
                    "int8_prepare: the first key " + std::to_string(keys.k0) + " is not a multiple of " +
                        std::to_string(kInt8KeyGroupTile) + " (K's scale groups lie in 128-key tiles: a prepare "
                        "covers whole tiles, docs/int8-attention.md §3)");
}

int64_t int8_tables_bytes(int64_t S, int64_t H, int64_t Dh) {
  return align_up(int8_stats_bytes(S, H, Dh), kAlign) + align_up(int8_vscale_bytes(S, H, Dh), kAlign);
}

std::pair<TensorView, TensorView> int8_tables_view(void* bytes, int64_t S, int64_t H, int64_t Dh, Device dev) {
  char* b = static_cast<char*>(bytes);
  const int64_t NB = int8_stat_blocks(S);
  return {TensorView(b, DType::f32, {2 + NB, H, Dh}, dev),
          TensorView(b + align_up(int8_stats_bytes(S, H, Dh), kAlign), DType::f32, {NB, 2, H, Dh}, dev)};
}

int64_t int8_all_scratch_bytes(int64_t Mk, int64_t H, int64_t Dh) {
  return int8_tables_bytes(Mk, H, Dh) + int8_keys_bytes(Mk, H, Dh);
}

Int8Keys int8_keys_view(void* bytes, int64_t n, int64_t H, int64_t Dh, Device dev, const TensorView& vs, int64_t k0) {
  const Parts p = parts(n, H, Dh);
  char* b = static_cast<char*>(bytes);
  Int8Keys k;
  k.k8 = TensorView(b + p.k8, DType::i8, {n, H, Dh}, dev);
  k.sk = TensorView(b + p.sk, DType::f32, {n, H}, dev);
  const int64_t ld = ld_of(n);
  k.v8t = TensorView(b + p.v8t, DType::i8, {H, Dh, ld}, dev);
  k.v8t.shape[2] = n;  // strides {Dh * ld, ld, 1} kept
  k.vs = vs;
  k.k0 = k0;
  return k;
}

Status attention_int8_all(Backend& be, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionParams& p, const TensorView& scratch) {
  const int64_t Mk = k.size(0), H = k.size(1), Dh = k.size(2);
  const int64_t need = int8_all_scratch_bytes(Mk, H, Dh);
  LS_CHECK_MSG(!scratch.empty() && scratch.is_contiguous() && scratch.nbytes() >= need,
               "int8 attention scratch " + scratch.shape_str() + " is smaller than " + std::to_string(need) +
                   " bytes");
  char* base = static_cast<char*>(scratch.data);
  const auto [stats, vs] = int8_tables_view(base, Mk, H, Dh, scratch.device);
  const Int8Keys keys = int8_keys_view(base + int8_tables_bytes(Mk, H, Dh), Mk, H, Dh, scratch.device, vs);
  LS_TRY(be.int8_key_stats(k, v, stats, /*k0=*/0, /*reset=*/true));
  LS_TRY(be.int8_prepare(k, v, stats, keys));
  return be.attention_int8(q, keys, out, p);
}

Status attention_all_keys(Backend& be, const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const AttentionParams& p, const TensorView& scratch) {
  if (be.numerics().attention == AttentionAlgorithm::int8) return attention_int8_all(be, q, k, v, out, p, scratch);
  return be.attention(q, k, v, out, p);
}

}  // namespace ls
