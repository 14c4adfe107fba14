// Collectives between the ranks of a sequence-parallel run (issue 16: Ulysses over N
// devices). Ranks exchange activations at the two boundaries of attention: tokens split
// across ranks for the token-wise ops, heads split for attention.
//
// Exactness: a collective here only MOVES bytes (no reduction, no arithmetic), so what a
// rank computes from the bytes it receives cannot depend on the number of ranks; the
// only thing N changes is which rank computes which rows or heads, and every op is
// row-wise (backend.h) and attention is per (query, head). That is why N ranks can give
// exactly the bytes of one (DESIGN.md §6).
//
// Contract: every rank of a group calls the same collectives in the same order with
// views of the same byte sizes; a call returns when this rank's receive view is filled
// and its send view may be reused. Views are contiguous, on the device of the rank's
// backend (host memory for the loopback group).
//
// Implementations: the in-process loopback group below (ranks are threads of one process
// over CPU memory; what CI tests N ranks with), and NCCL on CUDA (src/backend/cuda/
// comm_nccl.*, built with LAYERSTREAM_NCCL: one communicator per GPU of one process,
// the collectives queued on each backend's compute stream, ordered with its ops).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace ls {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "loopback rank 1 of 4"
  // recv = the concatenation over ranks r = 0 .. size-1 of rank r's send (recv holds
  // size() * send bytes).
  virtual Status all_gather(const TensorView& send, const TensorView& recv) = 0;
  // send is size() equal parts, part p for rank p; recv gets size() parts, part p from rank
  // p (send and recv of equal bytes, a multiple of size()).
  virtual Status all_to_all(const TensorView& send, const TensorView& recv) = 0;
  // Ends the group: every collective of any rank that is waiting, or called later,
  // returns an error saying which rank aborted. A rank whose own work failed calls it so
  // that its peers do not wait forever in their next collective. The group cannot be
  // used again (make a new one).
  virtual void abort() = 0;
};

// A group of n in-process ranks: element r is rank r's communicator; each is used by one
// thread (the rank's), and the group lives while any of them does. A rank whose peer
// stops calling blocks; a rank that passes mismatched sizes gets invalid_argument (and so
// do its peers in that call, naming the rank).
std::vector<std::unique_ptr<Communicator>> make_loopback_group(int n);

class Backend;
// The group for ranks on these backends (rank r on backends[r], all distinct): the
// loopback group when every backend is the CPU; NCCL when every one is a CUDA device of
// this process (a build with LAYERSTREAM_NCCL). Errors: a mix of device kinds, a
// backend listed twice, CUDA ranks in a build without NCCL (unsupported), NCCL's own.
Expected<std::vector<std::unique_ptr<Communicator>>> make_communicator_group(const std::vector<Backend*>& backends);

}  // namespace ls
