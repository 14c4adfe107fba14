// The NCCL communicator of sequence-parallel CUDA ranks (comm.h, docs/multi-gpu.md):
// one process drives every GPU of the group, one thread per rank, so the group is made
// once with ncclCommInitAll over the backends' devices (no bootstrap, no launcher).
// A collective is queued on the rank backend's compute stream, after the ops queued
// before it and before the ops queued after it, exactly like a backend op: the engine
// needs no extra synchronisation. all_to_all is one ncclSend + ncclRecv pair per peer in
// a group (ncclGroupStart/End), all_gather is ncclAllGather; both move bytes (ncclUint8),
// no reduction, so NCCL's algorithm choice can never change a bit.
#pragma once

#include <memory>
#include <vector>

#include "backend/comm.h"
#include "core/status.h"

namespace ls {
class Backend;
}

namespace ls::cuda {

// One communicator per backend (rank r on backends[r]; CUDA backends of distinct
// devices). Errors: NCCL's (ErrorCode::device), naming the call.
Expected<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>& backends);

}  // namespace ls::cuda
