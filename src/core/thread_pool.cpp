#include "core/thread_pool.h"

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

ThreadPool& pool() {
  if (!g_pool) {
    int n = g_requested > 0 ? g_requested : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    g_pool = std::make_unique<ThreadPool>(n);
  }
  return *g_pool;
}

}  // namespace

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  g_requested = n;
  g_pool.reset();
}

int num_threads() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  return pool().size();
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> lk(g_pool_mu);  // one parallel region at a time
  ThreadPool& p = pool();
  grain = std::max<int64_t>(grain, 1);
  int64_t parts = std::min<int64_t>(p.size(), (n + grain - 1) / grain);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  p.run([&](int i) {
    if (i >= parts) return;
    int64_t b = n * i / parts, e = n * (i + 1) / parts;
    if (b < e) fn(b, e);
  });
}

}  // namespace ls
