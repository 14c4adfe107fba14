// The CUDA backend's factory (included by src/backend/registry.cpp only).
// Plain C++: no CUDA headers, so the registry compiles with the host compiler.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "backend/description.h"

namespace ls {

// The backend on CUDA device `index`: one compute stream, a cuBLASLt handle and a
// cudaMalloc-backed MemoryResource. Fails (ErrorCode::device) with an actionable
// message when there is no such device or the driver is missing.
Expected<std::unique_ptr<Backend>> make_cuda_backend(int index);

// What this build of the CUDA backend holds (cuDNN, the Hopper kernel): the backend
// resolves and sizes from cuda_description(cuda_build()).
CudaBuild cuda_build();

}  // namespace ls
