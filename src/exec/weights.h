// Weight residency: the one place that decides where the forward's weights live
// (style-lessons §9). Today: all resident.
//  - CPU backend: the source's host views are used as they are (mapped file or
//    synthetic host buffers); nothing is copied.
//  - Any other backend: every weight the block loop, the refiner, the embeddings and
//    the heads read is copied to the device once, at creation, into one Arena on
//    backend.memory() sized exactly to their sum. AdaLN linears and the time embedder
//    are NOT made resident: only the AdaLN precompute reads them, through transient()
//    copies into its scratch arena, and never again afterwards.
// A later issue streams block weights (two block slots); that change stays inside
// this class.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/status.h"
#include "core/tensor.h"

namespace ls::h3 {
class H3TensorSource;
}

namespace ls::exec {

class WeightStore {
 public:
  static Expected<std::unique_ptr<WeightStore>> create(const h3::H3TensorSource& src, Backend& be);
  // Device view of a resident weight (LS_CHECK: the name is resident).
  TensorView get(const std::string& name) const;
  // Host view straight from the source (host-side work: RoPE inv_freq, curve table, PDD bank).
  TensorView host(const std::string& name) const;
  // A weight used only by the AdaLN precompute: the host view on the CPU, else a copy
  // into `scratch` (freed with the caller's scope).
  Expected<TensorView> transient(const std::string& name, Arena& scratch) const;
  // Bytes transient() would take from a device arena for `name` (0 on the CPU).
  uint64_t transient_bytes(const std::string& name) const;
  static bool is_precompute_only(const std::string& name);
  uint64_t device_bytes() const { return device_bytes_; }

 private:
  WeightStore(const h3::H3TensorSource& src, Backend& be) : src_(src), be_(be) {}
  const h3::H3TensorSource& src_;
  Backend& be_;
  bool host_resident_ = true;
  std::unique_ptr<Arena> arena_;
  std::map<std::string, TensorView> device_;
  uint64_t device_bytes_ = 0;
};

}  // namespace ls::exec
