// libFuzzer target: the safetensors reader on arbitrary bytes (SafetensorsReader::
// from_bytes runs the same validation as open() on a mapped file). Every input must
// give a value, ok or an error, never a crash, hang, leak or out-of-bounds read (ASan);
// an accepted file must keep the reader's promises, checked here:
//   - every entry's byte range lies in the data section and has numel x element size
//     bytes (so reading all of it is safe);
//   - entries are in offset order, back to back with the unsupported ones (exact
//     coverage), and find() gives each back;
//   - try_view() either refuses with a message or gives a view of the same bytes.
// Every error message is non-empty and printable ASCII (a hostile header must not be
// able to put raw bytes on a terminal or in a log).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/safetensors.h"

namespace {

void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_safetensors: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_message(const std::string& m) {
  if (m.empty()) fail("empty error message", "");
  for (unsigned char c : m)
    if (c < 0x20 || c >= 0x7f) fail("error message holds a non-printable byte", m);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = ls::SafetensorsReader::from_bytes(data, size, "fuzz.safetensors");
  if (!r.ok()) {
    check_message(r.error().message);
    return 0;
  }
  const ls::SafetensorsReader& f = **r;
  const uint64_t data_size = f.file_size() - f.data_start();
  uint64_t prev_end = 0, sum = 0;
  for (const ls::SafetensorsEntry& e : f.entries()) {
    if (e.begin > e.end || e.end > data_size) fail("entry outside the data section", e.name);
    if (e.begin < prev_end && e.begin != e.end) fail("entries overlap or are out of order", e.name);
    prev_end = e.end;
    const uint64_t want = static_cast<uint64_t>(e.numel()) * static_cast<uint64_t>(ls::dtype_size(e.dtype));
    if (e.end - e.begin != want) fail("byte range does not match the shape", e.name);
    if (f.find(e.name) != &e) fail("find() does not give the entry back", e.name);
    const auto* p = static_cast<const unsigned char*>(f.data(e));
    for (uint64_t i = 0; i < e.end - e.begin; ++i) sum += p[i];  // ASan: every byte readable
    auto v = f.try_view(e);
    if (!v.ok()) {
      check_message(v.error().message);
    } else if (v->data != f.data(e) || static_cast<uint64_t>(v->nbytes()) != want) {
      fail("try_view() differs from data()", e.name);
    }
  }
  for (const auto& [k, v] : f.metadata()) sum += k.size() + v.size();
  for (const std::string& u : f.unsupported_tensors()) sum += u.size();
  // Keep the reads from being optimised away.
  volatile uint64_t sink = sum;
  (void)sink;
  return 0;
}
