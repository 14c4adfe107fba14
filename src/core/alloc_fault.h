// Allocation-failure injection, for tests only: the k-th allocation after arming (host
// arena, pinned host memory, device memory; counted from 1) fails as if the system had
// no memory left, so a test can walk k = 1, 2, ... over a small run and check that each
// failure gives a clean error, leaks nothing and leaves no output file.
//
// Off unless armed. The library never arms it by itself (and never reads the
// environment); tests call arm_allocation_fault(), and the CLI maps its developer
// variable LAYERSTREAM_TEST_FAIL_ALLOC=k onto it (cli/main.cpp).
//
// Who counts: every MemoryResource::allocate of a non-zero size (the only raw
// allocators: the host resource of core/arena.cpp, the CUDA backend's cudaMalloc and
// cudaHostAlloc resources, cuda::PinnedHostBuffer) calls allocation_should_fail()
// first and returns ErrorCode::out_of_memory when it says so. Host std::vector
// buffers (synthetic weights, outputs) are not counted.
//
// Leaks: ASan does not see mmap'd or cudaMalloc'd blocks, so the same allocators also
// keep a count of the blocks they hold (allocation_made / allocation_released);
// live_allocations() returning to its earlier value after a failed run proves that
// every block taken before the failure was given back.
#pragma once

#include <cstdint>

namespace ls::testing {

// Make the k-th allocation from now fail (k >= 1); k = 0 disarms. Resets the count.
void arm_allocation_fault(int64_t k);
// Allocations counted since the last arm_allocation_fault() (armed or not).
int64_t allocations_seen();
// Called by every allocator before it allocates: true means "fail this one".
bool allocation_should_fail();

// Called by every allocator after a block was obtained / when it is freed.
void allocation_made();
void allocation_released();
// Blocks obtained and not yet freed, over every allocator (never reset).
int64_t live_allocations();

}  // namespace ls::testing
