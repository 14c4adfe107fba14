// libFuzzer target: H3 checkpoint detection, as `info FILE` and `--model FILE` run it
// (h3::open_h3_checkpoint: safetensors reader, key prefix, config detection from the
// tensor shapes and the metadata's "config" / "config.transformer" override, then the
// validation of every expected tensor).
//
// The input is a safetensors HEADER (JSON text), not a whole file: random mutations of
// a whole file almost never keep data_offsets consistent with the shapes, and would
// stop at the reader. So this target takes the header, gives every entry that has a
// dtype and a shape back-to-back data_offsets of the right size (entries without them
// stay as they are, for the reader to refuse), appends a zero-filled data section
// (sparse, in a memfd) and opens it through its /proc/self/fd path. The seeds are the
// headers of the committed tiny checkpoints and variants (prefix, curve form,
// overrides, a missing block).
//
// Every input must give a value, never a crash (ASan + UBSan); an accepted checkpoint
// is used: every expected tensor is fetched (with dtype conversion allowed, which
// converts), and its config printed both ways.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "model/h3/checkpoint.h"
#include "model/h3/config.h"

namespace {

using json = nlohmann::json;

// Data sections above this are not built (the target is about headers).
constexpr uint64_t kMaxData = 64ull << 20;

int element_size(const std::string& dtype) {
  if (auto t = ls::dtype_from_safetensors_name(dtype)) return ls::dtype_size(*t);
  for (const char* one : {"BOOL", "F8_E5M2", "F8_E8M0"})
    if (dtype == one) return 1;
  for (const char* two : {"I16", "U16"})
    if (dtype == two) return 2;
  if (dtype == "U32") return 4;
  for (const char* eight : {"I64", "U64", "C64"})
    if (dtype == eight) return 8;
  return 0;
}

void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_h3_detect: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  json header = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return 0;
  uint64_t offset = 0;
  for (auto it = header.begin(); it != header.end(); ++it) {
    json& e = it.value();
    if (it.key() == "__metadata__" || !e.is_object()) continue;
    auto dt = e.find("dtype");
    auto sh = e.find("shape");
    if (dt == e.end() || !dt->is_string() || sh == e.end() || !sh->is_array()) continue;
    uint64_t bytes = static_cast<uint64_t>(element_size(dt->get<std::string>()));
    if (bytes == 0) continue;
    for (const json& d : *sh) {
      if (!d.is_number_unsigned()) {
        bytes = 0;
        break;
      }
      if (__builtin_mul_overflow(bytes, d.get<uint64_t>(), &bytes) || bytes > kMaxData) return 0;
    }
    if (offset + bytes > kMaxData) return 0;
    e["data_offsets"] = {offset, offset + bytes};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception&) {
    return 0;  // invalid UTF-8 in a string: not representable (the reader tests cover it)
  }
  text.append((8 - text.size() % 8) % 8, ' ');

  static int fd = memfd_create("fuzz_h3_detect", MFD_CLOEXEC);
  if (fd < 0) fail("memfd_create", "");
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  if (ftruncate(fd, 0) != 0 || pwrite(fd, len, 8, 0) != 8 ||
      pwrite(fd, text.data(), text.size(), 8) != static_cast<ssize_t>(text.size()) ||
      ftruncate(fd, static_cast<off_t>(8 + text.size() + offset)) != 0)
    fail("writing the memfd", "");
  const std::string path = "/proc/self/fd/" + std::to_string(fd);

  for (bool convert : {false, true}) {
    ls::h3::OpenOptions opts;
    opts.allow_dtype_conversion = convert;
    auto src = ls::h3::open_h3_checkpoint(path, opts);
    if (!src.ok()) {
      if (src.error().message.empty()) fail("empty error message", "");
      continue;
    }
    const ls::h3::H3Config& cfg = (*src)->cfg();
    if (!ls::h3::check_h3_config(cfg).ok()) fail("accepted a config that check_h3_config refuses", "");
    volatile size_t sink = ls::h3::h3_config_summary(cfg).size() + ls::h3::h3_config_json(cfg).size() +
                           (*src)->describe().size();
    for (const ls::h3::TensorSpec& s : (*src)->specs()) {
      ls::TensorView v = (*src)->get(s.name);
      if (v.dtype != s.dtype) fail("get() gave another dtype", s.name);
      sink = sink + static_cast<size_t>(v.nbytes());
    }
    (void)sink;
  }
  return 0;
}
