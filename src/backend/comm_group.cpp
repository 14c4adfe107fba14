// make_communicator_group (comm.h): the loopback group for CPU ranks, NCCL for CUDA
// ranks. This file and registry.cpp are the core's only ones that test the build's
// CUDA / NCCL switches.
#include <set>

#include "backend/backend.h"
#include "backend/comm.h"

#if defined(LAYERSTREAM_NCCL) && LAYERSTREAM_NCCL
#include "backend/cuda/comm_nccl.h"
#endif

namespace ls {

Expected<std::vector<std::unique_ptr<Communicator>>> make_communicator_group(const std::vector<Backend*>& backends) {
  if (backends.empty()) return make_error(ErrorCode::invalid_argument, "a communicator group needs at least one rank");
  std::set<const Backend*> seen;
  std::set<std::string> devices;
  for (const Backend* b : backends) {
    LS_CHECK(b != nullptr);
    if (!seen.insert(b).second)
      return make_error(ErrorCode::invalid_argument, "the backend " + b->name() + " is listed twice: one backend per rank");
    if (b->device().kind != backends[0]->device().kind)
      return make_error(ErrorCode::invalid_argument, "ranks on " + backends[0]->name() + " and " + b->name() +
                                                         ": every rank of a group must be the same kind of device");
    if (b->device().kind != DeviceKind::cpu && !devices.insert(b->device().str()).second)
      return make_error(ErrorCode::invalid_argument, "the device " + b->device().str() + " is listed twice: one rank per device");
  }
  if (backends[0]->device().kind == DeviceKind::cpu) return make_loopback_group(static_cast<int>(backends.size()));
#if defined(LAYERSTREAM_NCCL) && LAYERSTREAM_NCCL
  return cuda::make_nccl_group(backends);
#else
  return make_error(ErrorCode::unsupported, "several " + backends[0]->device().str() +
                                                "-kind devices need NCCL, and this build has none (configure with the CUDA "
                                                "toolkit's NCCL found and -DLAYERSTREAM_NCCL=ON)");
#endif
}

}  // namespace ls
