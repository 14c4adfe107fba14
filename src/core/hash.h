// FNV-1a 64 over bytes. Continuing from an earlier result (`h`) gives the hash of the
// concatenation, so a hash over several buffers needs no copy:
//   fnv1a64(b.data(), nb, fnv1a64(a.data(), na)) == fnv1a64 of a's bytes then b's.
// Used for output fingerprints (the CLI, the benchmarks, ForwardResult::hash) and to key
// the synthetic weights by tensor name (model/h3/config.cpp): its values never change.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ls {

constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;

inline uint64_t fnv1a64(const void* data, size_t bytes, uint64_t h = kFnv1a64Offset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace ls
