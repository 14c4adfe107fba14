// NCCL communicator (comm_nccl.h). Built only with LAYERSTREAM_NCCL (CMakeLists.txt).
#include "backend/cuda/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/cuda_ext.h"

namespace ls::cuda {
namespace {

Error nccl_error(ncclResult_t r, const std::string& what) {
  return Error{ErrorCode::device, "NCCL " + what + " failed: " + ncclGetErrorString(r)};
}

uint64_t bytes_of(const TensorView& v) { return static_cast<uint64_t>(v.numel()) * static_cast<uint64_t>(v.elem_size()); }

// The group's communicators, shared by its ranks; destroyed (or aborted) together.
struct Group {
  std::vector<ncclComm_t> comms;
  std::mutex mu;
  int aborted_by = -1;
  // Per rank: held while that rank queues a collective, so abort() does not pull the
  // communicator from under a call being queued (it waits a moment, then aborts anyway:
  // ncclCommAbort is also what ends a call that hangs, e.g. waiting for the failed rank).
  std::unique_ptr<std::timed_mutex[]> queuing;
  ~Group() {
    if (aborted_by >= 0 || comms.empty()) return;  // ncclCommAbort already freed them
    // One thread holds every communicator of the group: finalize them together (a group
    // call), then destroy (finalizing one at a time could wait for the others).
    ncclGroupStart();
    for (ncclComm_t c : comms) ncclCommFinalize(c);
    ncclGroupEnd();
    for (ncclComm_t c : comms) ncclCommDestroy(c);
  }
};

// Makes `device` current for the calling thread for one collective (restored after).
class CurrentDevice {
 public:
  explicit CurrentDevice(int device) {
    if (cudaGetDevice(&prev_) == cudaSuccess && prev_ != device) set_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~CurrentDevice() {
    if (set_) cudaSetDevice(prev_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = 0;
  bool set_ = false;
};

class Nccl final : public Communicator {
 public:
  Nccl(std::shared_ptr<Group> g, int rank, Backend& be) : g_(std::move(g)), rank_(rank), be_(be) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(g_->comms.size()); }
  std::string name() const override {
    return "NCCL rank " + std::to_string(rank_) + " of " + std::to_string(size()) + " on " + be_.device().str();
  }

  Status all_gather(const TensorView& send, const TensorView& recv) override {
    LS_TRY(check(send, recv, false));
    std::lock_guard<std::timed_mutex> q(g_->queuing[static_cast<size_t>(rank_)]);
    LS_TRY(check_live());  // again under the lock: abort() may have run since check()
    CurrentDevice d(be_.device().index);
    const ncclResult_t r = ncclAllGather(send.data, recv.data, bytes_of(send), ncclUint8, comm(), compute_stream(be_));
    if (r != ncclSuccess) return nccl_error(r, "all_gather (" + name() + ")");
    return Status();
  }

  Status all_to_all(const TensorView& send, const TensorView& recv) override {
    LS_TRY(check(send, recv, true));
    std::lock_guard<std::timed_mutex> q(g_->queuing[static_cast<size_t>(rank_)]);
    LS_TRY(check_live());  // again under the lock: abort() may have run since check()
    CurrentDevice d(be_.device().index);
    const size_t n = static_cast<size_t>(size()), part = bytes_of(send) / n;
    cudaStream_t stream = compute_stream(be_);
    const auto* src = static_cast<const unsigned char*>(send.data);
    auto* dst = static_cast<unsigned char*>(recv.data);
    ncclResult_t r = ncclGroupStart();
    for (size_t p = 0; p < n && r == ncclSuccess; ++p) {
      r = ncclSend(src + p * part, part, ncclUint8, static_cast<int>(p), comm(), stream);
      if (r == ncclSuccess) r = ncclRecv(dst + p * part, part, ncclUint8, static_cast<int>(p), comm(), stream);
    }
    const ncclResult_t e = ncclGroupEnd();
    if (r == ncclSuccess) r = e;
    if (r != ncclSuccess) return nccl_error(r, "all_to_all (" + name() + ")");
    return Status();
  }

  void abort() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->aborted_by >= 0) return;
    g_->aborted_by = rank_;
    // Every rank's kernels may wait for this one: abort the whole group's communicators.
    for (size_t r = 0; r < g_->comms.size(); ++r) {
      const bool locked = g_->queuing[r].try_lock_for(std::chrono::seconds(2));
      ncclCommAbort(g_->comms[r]);
      if (locked) g_->queuing[r].unlock();
    }
  }

 private:
  ncclComm_t comm() const { return g_->comms[static_cast<size_t>(rank_)]; }
  Status check_live() const {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->aborted_by >= 0)
      return make_error(ErrorCode::device, name() + ": rank " + std::to_string(g_->aborted_by) + " aborted the group");
    return Status();
  }
  Status check(const TensorView& send, const TensorView& recv, bool to_all) const {
    LS_TRY(check_live());
    const uint64_t sb = bytes_of(send), rb = bytes_of(recv), n = static_cast<uint64_t>(size());
    if (!send.is_contiguous() || !recv.is_contiguous() || send.device != be_.device() || recv.device != be_.device())
      return make_error(ErrorCode::invalid_argument, name() + ": views must be contiguous on " + be_.device().str());
    if (to_all ? (rb != sb || sb % n != 0) : rb != sb * n)
      return make_error(ErrorCode::invalid_argument, name() + ": " + std::to_string(sb) + " bytes sent, " +
                                                         std::to_string(rb) + " received does not fit " +
                                                         (to_all ? "all_to_all" : "all_gather"));
    return Status();
  }

  std::shared_ptr<Group> g_;
  int rank_;
  Backend& be_;
};

}  // namespace

Expected<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<Backend*>& backends) {
  auto g = std::make_shared<Group>();
  std::vector<int> devices;
  for (const Backend* b : backends) {
    LS_CHECK(b != nullptr && b->device().kind == DeviceKind::cuda);
    devices.push_back(b->device().index);
  }
  g->comms.resize(backends.size());
  g->queuing = std::make_unique<std::timed_mutex[]>(backends.size());
  const ncclResult_t r = ncclCommInitAll(g->comms.data(), static_cast<int>(devices.size()), devices.data());
  if (r != ncclSuccess) {
    g->comms.clear();
    return nccl_error(r, "ncclCommInitAll over " + std::to_string(devices.size()) + " GPUs");
  }
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t i = 0; i < backends.size(); ++i) out.push_back(std::make_unique<Nccl>(g, static_cast<int>(i), *backends[i]));
  return out;
}

}  // namespace ls::cuda
