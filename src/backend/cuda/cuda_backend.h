// The CUDA backend's factory (included by src/backend/registry.cpp only).
// Plain C++: no CUDA headers, so the registry compiles with the host compiler.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace ls {

// The backend on CUDA device `index`: one compute stream, a cuBLASLt handle and a
// cudaMalloc-backed MemoryResource. Fails (ErrorCode::device) with an actionable
// message when there is no such device or the driver is missing.
Expected<std::unique_ptr<Backend>> make_cuda_backend(int index);

}  // namespace ls
