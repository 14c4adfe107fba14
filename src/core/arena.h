// Arena: every activation byte the engine takes on a device comes from one Arena
// (DESIGN.md §2). It takes one block of `capacity` bytes from a MemoryResource up
// front and hands out 256-byte-aligned pieces in stack order (LIFO).
//
// Why a stack: the executor's lifetimes are nested (forward > block > pass > slice),
// so LIFO costs nothing, and it makes the footprint exactly the sum of the live
// buffers. That is what lets the planner predict the peak exactly (each buffer
// rounded up with Arena::aligned_bytes) and what makes "measured peak <= predicted
// peak" a meaningful test: the arena refuses to grow past its capacity.
//
// Usage:
//   Arena arena(resource, plan.predicted_peak_bytes);
//   auto x = arena.alloc(DType::bf16, {S, D}, "residual x");   // Expected<TensorView>
//   { Arena::Scope slice(arena);  ... per-slice temporaries ... }  // rewound here
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/tensor.h"

namespace ls {

// Where raw memory comes from. The CPU resource maps anonymous memory (pages are
// committed when touched); the CUDA backend provides one over cudaMalloc. This is the
// only place raw allocations happen.
class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  virtual Device device() const = 0;
  virtual Expected<void*> allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
};

MemoryResource& host_memory_resource();

class Arena {
 public:
  static constexpr size_t kAlignment = 256;
  static constexpr size_t aligned_bytes(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

  // Reserves `capacity` bytes at once. A capacity of 0 is allowed (an arena that
  // refuses everything).
  static Expected<std::unique_ptr<Arena>> create(MemoryResource& res, size_t capacity);
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // A contiguous tensor of the given shape; fails with out_of_budget (naming `what`,
  // the request and the capacity) when it does not fit.
  Expected<TensorView> alloc(DType t, std::initializer_list<int64_t> dims, const char* what);
  Expected<void*> alloc_bytes(size_t bytes, const char* what);

  struct Mark { size_t offset = 0; };
  Mark mark() const { return Mark{used_}; }
  void rewind(Mark m);  // frees everything allocated after m

  class Scope {
   public:
    explicit Scope(Arena& a) : arena_(a), mark_(a.mark()) {}
    ~Scope() { arena_.rewind(mark_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
   private:
    Arena& arena_;
    Mark mark_;
  };

  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t capacity() const { return capacity_; }
  Device device() const { return res_.device(); }
  void reset_peak() { peak_ = used_; }

 private:
  Arena(MemoryResource& res, void* base, size_t capacity) : res_(res), base_(base), capacity_(capacity) {}
  MemoryResource& res_;
  void* base_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t peak_ = 0;
};

std::string format_bytes(uint64_t bytes);  // "1.114 GiB", "512.0 MiB", "900 B"

}  // namespace ls
