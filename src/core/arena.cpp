#include "core/arena.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>

#include "core/alloc_fault.h"

namespace ls {

namespace {
class HostMemoryResource final : public MemoryResource {
 public:
  Device device() const override { return Device{}; }
  Expected<void*> allocate(size_t bytes) override {
    if (bytes == 0) return static_cast<void*>(nullptr);
    if (testing::allocation_should_fail())  // a test's injected failure (core/alloc_fault.h)
      return make_error(ErrorCode::out_of_memory, "cannot reserve " + format_bytes(bytes) +
                                                      " of host memory (injected allocation failure)");
    // MAP_NORESERVE: a large capacity costs address space, not memory, until touched.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      return make_error(ErrorCode::out_of_memory, "cannot reserve " + format_bytes(bytes) + " of host memory");
    testing::allocation_made();
    return p;
  }
  void deallocate(void* p, size_t bytes) override {
    if (!p) return;
    munmap(p, bytes);
    testing::allocation_released();
  }
};
}  // namespace

MemoryResource& host_memory_resource() {
  static HostMemoryResource r;
  return r;
}

Expected<std::unique_ptr<Arena>> Arena::create(MemoryResource& res, size_t capacity) {
  if (capacity > SIZE_MAX - kAlignment)  // aligned_bytes would wrap around to a tiny capacity
    return make_error(ErrorCode::out_of_memory, "cannot reserve an arena of " + format_bytes(capacity));
  capacity = aligned_bytes(capacity);
  LS_ASSIGN_OR_RETURN(void* base, res.allocate(capacity));
  return std::unique_ptr<Arena>(new Arena(res, base, capacity));
}

Arena::~Arena() { res_.deallocate(base_, capacity_); }

Expected<void*> Arena::alloc_bytes(size_t bytes, const char* what) {
  // Compare before rounding: aligned_bytes(bytes) wraps around for bytes near SIZE_MAX.
  // capacity_ and used_ are multiples of kAlignment, so bytes <= free implies n <= free.
  const size_t free_bytes = capacity_ - used_;
  size_t n = bytes <= free_bytes ? aligned_bytes(bytes) : bytes;
  if (n > free_bytes) {
    return make_error(ErrorCode::out_of_budget,
                      std::string("arena on ") + res_.device().str() + ": " + what + " needs " + format_bytes(n) +
                          " but only " + format_bytes(capacity_ - used_) + " of " + format_bytes(capacity_) +
                          " are free");
  }
  void* p = static_cast<char*>(base_) + used_;
  used_ += n;
  if (used_ > peak_) peak_ = used_;
  return p;
}

Expected<TensorView> Arena::alloc(DType t, std::initializer_list<int64_t> dims, const char* what) {
  uint64_t n = 1;
  bool overflow = false;
  for (int64_t d : dims) {
    LS_CHECK_MSG(d >= 0, std::string("negative dimension for ") + what);
    overflow = overflow || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n);
  }
  uint64_t bytes = 0;
  overflow = overflow || __builtin_mul_overflow(n, static_cast<uint64_t>(dtype_size(t)), &bytes) ||
             bytes > static_cast<uint64_t>(INT64_MAX);
  if (overflow) {
    return make_error(ErrorCode::out_of_budget, std::string("arena on ") + res_.device().str() + ": " + what +
                                                    " has a shape whose byte size overflows 64 bits");
  }
  LS_ASSIGN_OR_RETURN(void* p, alloc_bytes(static_cast<size_t>(bytes), what));
  TensorView v(p, t, dims, res_.device());
  return v;
}

void Arena::rewind(Mark m) {
  LS_CHECK_MSG(m.offset <= used_, "Arena::rewind to a mark above the top (LIFO order broken)");
  used_ = m.offset;
}

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.3f GiB", b / (1ull << 30));
  else if (bytes >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1ull << 20));
  else if (bytes >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1ull << 10));
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  return buf;
}

}  // namespace ls
