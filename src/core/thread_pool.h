// A fixed pool of worker threads for row-parallel CPU ops.
//
// parallel_for splits [0, n) into contiguous ranges and runs fn(begin, end) on them.
// Ops compute every row from that row alone, so how rows are split over threads can
// never change a bit of the result (tested: 1 thread against all threads).
#pragma once

#include <cstdint>
#include <functional>

namespace ls {

// Number of threads the global pool uses; set_num_threads(0) = hardware concurrency.
// Call before the first parallel_for (or between runs; it rebuilds the pool).
void set_num_threads(int n);
int num_threads();

// Runs fn over [0, n) in chunks of at least `grain` items; blocks until done.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace ls
