#include "core/thread_pool.h"

#include "core/status.h"

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace ls {

namespace {

class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { loop(i); });
    size_ = n;
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return size_; }

  // Runs task(i) for i in [0, size) with i = 0 on the calling thread.
  void run(const std::function<void(int)>& task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      task_ = &task;
      pending_ = size_ - 1;
      ++generation_;
    }
    cv_.notify_all();
    task(0);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* task;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return generation_ != seen; });
        seen = generation_;
        if (stop_) return;
        task = task_;
      }
      (*task)(index);
      {
        std::lock_guard<std::mutex> lk(mu_);
        --pending_;
      }
      done_cv_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  int size_ = 1;
  bool stop_ = false;
};

std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;
int g_requested = 0;
// Set on every thread while it runs a parallel_for body. A nested parallel_for then
// runs inline on that thread (taking g_pool_mu again would deadlock, and the pool's
// threads are all busy anyway); rows are independent, so the bits are the same.
thread_local bool tl_in_parallel_region = false;

struct RegionFlag {
  RegionFlag() { tl_in_parallel_region = true; }
  ~RegionFlag() { tl_in_parallel_region = false; }
  RegionFlag(const RegionFlag&) = delete;
  RegionFlag& operator=(const RegionFlag&) = delete;
};

ThreadPool& pool() {
  if (!g_pool) {
    int n = g_requested > 0 ? g_requested : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    g_pool = std::make_unique<ThreadPool>(n);
  }
  return *g_pool;
}

}  // namespace

void set_num_threads(int n) {
  LS_CHECK_MSG(!tl_in_parallel_region, "set_num_threads called inside a parallel_for body");
  std::lock_guard<std::mutex> lk(g_pool_mu);
  g_requested = n;
  g_pool.reset();
}

int num_threads() {
  // Inside a region the outer parallel_for holds g_pool_mu and the pool cannot change.
  if (tl_in_parallel_region) return g_pool->size();
  std::lock_guard<std::mutex> lk(g_pool_mu);
  return pool().size();
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (tl_in_parallel_region) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> lk(g_pool_mu);  // one parallel region at a time
  ThreadPool& p = pool();
  grain = std::max<int64_t>(grain, 1);
  // Every chunk holds at least `grain` items (unless n < grain): at most n / grain
  // parts. (Rounding n / grain up here would give chunks smaller than grain.)
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(p.size(), n / grain));
  if (parts <= 1) {
    RegionFlag flag;
    fn(0, n);
    return;
  }
  // Part i is [n*i/parts, n*(i+1)/parts): sizes differ by at most one. Written as
  // q*i + r*i/parts so that n*i cannot overflow int64 for any n.
  const int64_t q = n / parts, r = n % parts;
  auto bound = [&](int64_t i) { return q * i + r * i / parts; };
  p.run([&](int i) {
    if (i >= parts) return;
    RegionFlag flag;
    const int64_t b = bound(i), e = bound(i + 1);
    if (b < e) fn(b, e);
  });
}

}  // namespace ls
