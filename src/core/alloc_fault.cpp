#include "core/alloc_fault.h"

#include <atomic>

namespace ls::testing {

namespace {
std::atomic<int64_t> g_fail_at{0};  // 0 = disarmed
std::atomic<int64_t> g_seen{0};
std::atomic<int64_t> g_live{0};
}  // namespace

void arm_allocation_fault(int64_t k) {
  g_seen.store(0);
  g_fail_at.store(k < 0 ? 0 : k);
}

int64_t allocations_seen() { return g_seen.load(); }

bool allocation_should_fail() {
  const int64_t n = g_seen.fetch_add(1) + 1;
  const int64_t k = g_fail_at.load();
  return k != 0 && n == k;
}

void allocation_made() { g_live.fetch_add(1, std::memory_order_relaxed); }
void allocation_released() { g_live.fetch_sub(1, std::memory_order_relaxed); }
int64_t live_allocations() { return g_live.load(); }

}  // namespace ls::testing
