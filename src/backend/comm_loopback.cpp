// The in-process loopback group (comm.h): ranks are threads; a collective is a
// rendezvous. Phase 1: every rank posts its views and waits for all posts; then each rank
// copies what it receives straight from its peers' send views; phase 2: every rank waits
// until all copies are done, so no rank returns (and reuses its send view) while a peer
// still reads it.
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "backend/comm.h"

namespace ls {
namespace {

struct Group {
  explicit Group(int ranks) : n(ranks), send(static_cast<size_t>(ranks)), recv(static_cast<size_t>(ranks)) {}
  const int n;
  std::mutex mu;
  std::condition_variable cv;
  // Rendezvous state of the current call.
  std::vector<const TensorView*> send, recv;
  int posted = 0, copied = 0;
  uint64_t generation = 0;  // completed calls
  std::string error;        // set by the last poster when the views do not fit
  int aborted_by = -1;      // Communicator::abort: the rank that ended the group

  // Blocks until all n ranks reached this barrier point (counter `c`).
  void wait_all(std::unique_lock<std::mutex>& lock, int& c, uint64_t gen) {
    ++c;
    if (c == n) cv.notify_all();
    cv.wait(lock, [&] { return c == n || generation != gen || aborted_by >= 0; });
  }
};

uint64_t bytes_of(const TensorView& v) { return static_cast<uint64_t>(v.numel()) * static_cast<uint64_t>(v.elem_size()); }

class Loopback final : public Communicator {
 public:
  Loopback(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->n; }
  std::string name() const override {
    return "loopback rank " + std::to_string(rank_) + " of " + std::to_string(g_->n);
  }
  Status all_gather(const TensorView& send, const TensorView& recv) override { return run(send, recv, false); }
  Status all_to_all(const TensorView& send, const TensorView& recv) override { return run(send, recv, true); }
  void abort() override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->aborted_by < 0) g_->aborted_by = rank_;
    g_->cv.notify_all();
  }

 private:
  Status run(const TensorView& send, const TensorView& recv, bool to_all) {
    Group& g = *g_;
    const size_t n = static_cast<size_t>(g.n);
    std::unique_lock<std::mutex> lock(g.mu);
    // An aborted group: no rank copies any more (a rank only aborts outside a call, so
    // no peer can be reading its views).
    auto aborted = [&]() {
      return make_error(ErrorCode::device, std::string(to_all ? "all_to_all" : "all_gather") + " (" + name() +
                                               "): rank " + std::to_string(g.aborted_by) + " aborted the group");
    };
    if (g.aborted_by >= 0) return aborted();
    const uint64_t gen = g.generation;
    g.send[static_cast<size_t>(rank_)] = &send;
    g.recv[static_cast<size_t>(rank_)] = &recv;
    if (g.posted + 1 == g.n) {
      // The last to post checks every rank's views (so all ranks see the same verdict).
      g.error.clear();
      const uint64_t s0 = bytes_of(*g.send[0]);
      for (size_t r = 0; r < n && g.error.empty(); ++r) {
        const TensorView& s = *g.send[r];
        const TensorView& d = *g.recv[r];
        const uint64_t sb = bytes_of(s), rb = bytes_of(d);
        if (!s.is_contiguous() || !d.is_contiguous())
          g.error = "rank " + std::to_string(r) + " passed a strided view";
        else if (sb != s0)
          g.error = "rank " + std::to_string(r) + " sends " + std::to_string(sb) + " bytes, rank 0 " + std::to_string(s0);
        else if (to_all ? (rb != sb || sb % n != 0) : rb != sb * n)
          g.error = "rank " + std::to_string(r) + ": " + std::to_string(sb) + " bytes sent, " + std::to_string(rb) +
                    " received does not fit " + (to_all ? "all_to_all (equal, a multiple of the ranks)" : "all_gather (ranks x sent)");
      }
    }
    g.wait_all(lock, g.posted, gen);
    if (g.aborted_by >= 0 && g.posted < g.n && g.generation == gen) return aborted();
    const std::string error = g.error;
    if (error.empty()) {
      // Copy outside the lock: each rank writes only its own receive view.
      lock.unlock();
      const uint64_t sb = bytes_of(send);
      auto* dst = static_cast<unsigned char*>(recv.data);
      for (size_t p = 0; p < n; ++p) {
        const auto* src = static_cast<const unsigned char*>(g.send[p]->data);
        if (to_all) {
          const uint64_t part = sb / n;
          std::memcpy(dst + p * part, src + static_cast<size_t>(rank_) * part, part);
        } else {
          std::memcpy(dst + p * sb, src, sb);
        }
      }
      lock.lock();
    }
    g.wait_all(lock, g.copied, gen);
    if (g.generation == gen) {  // the first to leave resets the call
      g.posted = g.copied = 0;
      ++g.generation;
      g.cv.notify_all();
    }
    if (!error.empty())
      return make_error(ErrorCode::invalid_argument, std::string(to_all ? "all_to_all" : "all_gather") + " (" + name() +
                                                         "): " + error);
    return Status();
  }
  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_loopback_group(int n) {
  LS_CHECK_MSG(n >= 1, "loopback group of " + std::to_string(n) + " ranks");
  auto g = std::make_shared<Group>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<Loopback>(g, r));
  return out;
}

}  // namespace ls
