// `layerstream info --check FILE`: every tensor of any safetensors file scanned for NaN /
// +inf / -inf (cli/info/info.h).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "core/arena.h"  // format_bytes
#include "core/printable.h"
#include "io/mapping_guard.h"
#include "io/safetensors.h"
#include "cli/info/info.h"

namespace ls::cli::info {

namespace {

struct NonFinite {
  int64_t nan = 0, pos_inf = 0, neg_inf = 0;
  int64_t first = -1;  // element index of the first non-finite value, -1 when none
  int64_t total() const { return nan + pos_inf + neg_inf; }
};

// Counts by bit pattern, without converting: an IEEE value is non-finite iff its
// exponent field is all ones (kExp), a NaN iff a mantissa bit is set too (magnitude bits
// above kExp), an infinity iff exactly kExp, with the sign bit telling +inf from -inf.
// Words are read with memcpy (a tensor may sit misaligned in the mapping). Blocks of
// 4096 elements: the counting loop has no branch; the first index is located inside the
// first block that counted anything, so the data is read once.
template <typename U, U kExp, U kAbs>
void count_ieee(const unsigned char* p, int64_t n, NonFinite* r) {
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    int64_t nan = 0, inf = 0, neg = 0;
    for (int64_t i = b; i < e; ++i) {
      U w;
      std::memcpy(&w, p + static_cast<size_t>(i) * sizeof(U), sizeof(U));
      const U a = static_cast<U>(w & kAbs);
      nan += a > kExp;
      inf += a == kExp;
      neg += a == kExp && w != a;
    }
    if (nan + inf > 0 && r->first < 0)
      for (int64_t i = b; i < e && r->first < 0; ++i) {
        U w;
        std::memcpy(&w, p + static_cast<size_t>(i) * sizeof(U), sizeof(U));
        if (static_cast<U>(w & kAbs) >= kExp) r->first = i;
      }
    r->nan += nan;
    r->pos_inf += inf - neg;
    r->neg_inf += neg;
  }
}

// fp8 e4m3fn has no infinity; NaN is S.1111.111.
void count_f8e4m3(const unsigned char* p, int64_t n, NonFinite* r) {
  for (int64_t i = 0; i < n; ++i)
    if ((p[i] & 0x7F) == 0x7F) {
      if (r->first < 0) r->first = i;
      ++r->nan;
    }
}

// false for integer dtypes (nothing to scan: every value is finite).
bool scan_nonfinite(const unsigned char* p, DType t, int64_t n, NonFinite* r) {
  switch (t) {
    case DType::f64: count_ieee<uint64_t, 0x7FF0000000000000ull, 0x7FFFFFFFFFFFFFFFull>(p, n, r); return true;
    case DType::f32: count_ieee<uint32_t, 0x7F800000u, 0x7FFFFFFFu>(p, n, r); return true;
    case DType::bf16: count_ieee<uint16_t, 0x7F80, 0x7FFF>(p, n, r); return true;
    case DType::f16: count_ieee<uint16_t, 0x7C00, 0x7FFF>(p, n, r); return true;
    case DType::f8e4m3: count_f8e4m3(p, n, r); return true;
    case DType::i8:
    case DType::i32:
    case DType::u8: return false;
  }
  return false;
}

}  // namespace

// `info --check FILE`: every tensor of any safetensors file (a checkpoint, a forward's
// output), one pass through the read-only mapping.
int run_check(const InfoOptions& o) {
  auto f = SafetensorsReader::open(o.file);
  if (!f.ok()) return fail(f.error());
  const SafetensorsReader& r = **f;
  // Advice only: read ahead and drop behind (a 66 GB checkpoint need not stay resident).
  if (!r.entries().empty()) {
    const auto& e0 = r.entries().front();
    const uintptr_t data = reinterpret_cast<uintptr_t>(r.data(e0)) - e0.begin;
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t base = data / page * page;
    madvise(reinterpret_cast<void*>(base), r.file_size() - r.data_start() + (data - base), MADV_SEQUENTIAL);
  }
  json bad = json::array();
  NonFinite all;
  int64_t tensors_bad = 0, scanned = 0, integer = 0;
  uint64_t elements = 0, bytes = 0;
  std::vector<std::string> lines;
  for (const SafetensorsEntry& e : r.entries()) {
    NonFinite nf;
    const int64_t n = e.numel();
    if (!scan_nonfinite(static_cast<const unsigned char*>(r.data(e)), e.dtype, n, &nf)) {
      ++integer;
      continue;
    }
    ++scanned;
    elements += static_cast<uint64_t>(n);
    bytes += e.end - e.begin;
    if (nf.total() == 0) continue;
    ++tensors_bad;
    all.nan += nf.nan, all.pos_inf += nf.pos_inf, all.neg_inf += nf.neg_inf;
    bad.push_back({{"name", e.name}, {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"nan", nf.nan},
                   {"pos_inf", nf.pos_inf}, {"neg_inf", nf.neg_inf}, {"first_index", nf.first}});
    char b[256];
    std::snprintf(b, sizeof b, "%s %s: NaN %lld, +inf %lld, -inf %lld (first at element %lld of %lld)",
                  dtype_name(e.dtype), shape_json_str(e.shape).c_str(), static_cast<long long>(nf.nan),
                  static_cast<long long>(nf.pos_inf), static_cast<long long>(nf.neg_inf),
                  static_cast<long long>(nf.first), static_cast<long long>(n));
    lines.push_back(printable_text(e.name) + "  " + b);  // a file's bytes: escaped
  }
  // The file truncated while it was scanned (io/mapping_guard.h): its zeros are no answer.
  if (Status s = io::check_mapped_files(); !s.ok()) return fail(s.error());
  const int64_t total = static_cast<int64_t>(r.entries().size());
  std::string summary;
  if (all.total() == 0) {
    summary = "all " + std::to_string(scanned) + " floating-point tensors finite (" + std::to_string(elements) +
              " values, " + format_bytes(bytes) + ")";
  } else {
    summary = std::to_string(all.total()) + " non-finite values (NaN " + std::to_string(all.nan) + ", +inf " +
              std::to_string(all.pos_inf) + ", -inf " + std::to_string(all.neg_inf) + ") in " +
              std::to_string(tensors_bad) + " of " + std::to_string(scanned) + " floating-point tensors";
  }
  if (o.as_json) {
    json out = {{"file", o.file},
                {"tensors", total},
                {"scanned_tensors", scanned},
                {"integer_tensors", integer},
                {"scanned_values", elements},
                {"scanned_bytes", bytes},
                {"nonfinite", {{"values", all.total()}, {"nan", all.nan}, {"pos_inf", all.pos_inf},
                               {"neg_inf", all.neg_inf}, {"tensors", tensors_bad}}},
                {"nonfinite_tensors", bad},
                {"not_scanned", r.unsupported_tensors()},
                {"finite", all.total() == 0},
                {"summary", summary}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf("checked     %s (%s): %lld tensors", o.file.c_str(), format_bytes(r.file_size()).c_str(),
                static_cast<long long>(total));
    if (integer > 0) std::printf(", %lld of them integer (nothing to check)", static_cast<long long>(integer));
    std::printf("\n");
    for (const auto& u : r.unsupported_tensors())
      std::printf("not checked %s: a dtype LayerStream does not read\n", printable_text(u).c_str());
    for (const auto& l : lines) std::printf("non-finite  %s\n", l.c_str());
    std::printf("result      %s\n", summary.c_str());
  }
  if (all.total() == 0) return 0;
  std::fprintf(stderr, "%s: error: %s holds %s (first: %s)\n", kCmd, printable_text(o.file).c_str(), summary.c_str(),
               printable_text(bad.front()["name"].get<std::string>()).c_str());
  return kExitRuntime;
}

}  // namespace ls::cli::info
