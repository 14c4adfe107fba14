// Guarded file mappings (io/mapping_guard.h).
//
// The handler runs on whichever thread touched the vanished page and may interrupt any
// code, so it reads only lock-free atomics and calls only mmap (a system call) and the
// previous handler. Registration claims a slot with a compare-exchange and publishes
// the range last; unregistration clears the range first.
#include "io/mapping_guard.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace ls::io {

namespace {

constexpr int kSlots = 4096;

struct Slot {
  std::atomic<int> used{0};            // claimed by a registration
  std::atomic<uintptr_t> begin{0};     // 0: not (yet / any more) a guarded range
  std::atomic<uintptr_t> end{0};
  std::atomic<int> damaged{0};
  std::string path;                    // written before begin is published
};

Slot g_slots[kSlots];
uintptr_t g_page = 4096;
struct sigaction g_previous {};
std::once_flag g_installed;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info != nullptr ? info->si_addr : nullptr);
  for (Slot& s : g_slots) {
    const uintptr_t b = s.begin.load(std::memory_order_acquire);
    if (b == 0 || addr < b) continue;
    const uintptr_t e = s.end.load(std::memory_order_acquire);
    if (addr >= e) continue;
    // Zero pages over the rest of the mapping: past a truncation every later page is
    // gone too, so one fault covers them all.
    const uintptr_t from = addr & ~(g_page - 1);
    void* p = mmap(reinterpret_cast<void*>(from), e - from, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (p != MAP_FAILED) {
      s.damaged.store(1, std::memory_order_release);
      return;  // the faulting access runs again and reads zeros
    }
    break;  // cannot repair: the default action below
  }
  // Not a guarded mapping: whatever handled SIGBUS before us.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  // The default action: restore it; the faulting access runs again and ends the process.
  signal(SIGBUS, SIG_DFL);
}

void install() {
  const long page = sysconf(_SC_PAGESIZE);
  if (page > 0) g_page = static_cast<uintptr_t>(page);
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

void guard_mapping(const void* base, size_t size, const std::string& path) {
  if (base == nullptr || size == 0) return;
  std::call_once(g_installed, install);
  for (Slot& s : g_slots) {
    int expected = 0;
    if (!s.used.compare_exchange_strong(expected, 1)) continue;
    s.path = path;
    s.damaged.store(0);
    s.end.store(reinterpret_cast<uintptr_t>(base) + size, std::memory_order_release);
    s.begin.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    return;
  }
}

void unguard_mapping(const void* base) {
  const auto b = reinterpret_cast<uintptr_t>(base);
  for (Slot& s : g_slots) {
    if (s.used.load() == 0 || s.begin.load() != b) continue;
    s.begin.store(0, std::memory_order_release);
    s.end.store(0, std::memory_order_release);
    s.damaged.store(0);
    s.path.clear();
    s.used.store(0, std::memory_order_release);
    return;
  }
}

Status check_mapped_files() {
  for (Slot& s : g_slots) {
    if (s.begin.load(std::memory_order_acquire) == 0 || s.damaged.load(std::memory_order_acquire) == 0) continue;
    return make_error(ErrorCode::io, s.path + ": the file was truncated or overwritten on disk while LayerStream was "
                                              "reading it (its pages past the new end read as zeros); nothing "
                                              "computed from it is returned. Keep a model file unchanged while it "
                                              "is loaded, then load it again");
  }
  return {};
}

}  // namespace ls::io
