// The loopback communicator (backend/comm.h): N in-process ranks as threads. Collectives
// move bytes exactly (checked against the definition byte by byte), over many calls in a
// row, and views that do not fit are refused on every rank alike.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "backend/comm.h"

using namespace ls;

namespace {

// Runs fn(rank, comm) on one thread per rank.
template <typename Fn>
void on_ranks(int n, Fn fn) {
  auto group = make_loopback_group(n);
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back([&, r] { fn(r, *group[static_cast<size_t>(r)]); });
  for (auto& th : t) th.join();
}

uint8_t byte_of(int rank, int call, size_t i) { return static_cast<uint8_t>(rank * 37 + call * 11 + i * 3 + 1); }

class Loopback : public ::testing::TestWithParam<int> {};

TEST_P(Loopback, AllGatherConcatenatesEveryRanksBytes) {
  const int n = GetParam();
  const size_t bytes = 24;  // per rank
  on_ranks(n, [&](int r, Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), n);
    for (int call = 0; call < 20; ++call) {
      std::vector<uint8_t> send(bytes), recv(bytes * static_cast<size_t>(n), 0);
      for (size_t i = 0; i < bytes; ++i) send[i] = byte_of(r, call, i);
      ASSERT_TRUE(c.all_gather(TensorView(send.data(), DType::u8, {static_cast<int64_t>(bytes)}),
                               TensorView(recv.data(), DType::u8, {static_cast<int64_t>(recv.size())}))
                      .ok());
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(recv[static_cast<size_t>(p) * bytes + i], byte_of(p, call, i));
    }
  });
}

TEST_P(Loopback, AllToAllSendsPartPToRankP) {
  const int n = GetParam();
  const size_t part = 12, bytes = part * static_cast<size_t>(n);
  on_ranks(n, [&](int r, Communicator& c) {
    for (int call = 0; call < 20; ++call) {
      std::vector<uint8_t> send(bytes), recv(bytes, 0);
      for (size_t i = 0; i < bytes; ++i) send[i] = byte_of(r, call, i);
      ASSERT_TRUE(c.all_to_all(TensorView(send.data(), DType::u8, {static_cast<int64_t>(bytes)}),
                               TensorView(recv.data(), DType::u8, {static_cast<int64_t>(bytes)}))
                      .ok());
      // Part p of recv is part r of rank p's send.
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < part; ++i)
          ASSERT_EQ(recv[static_cast<size_t>(p) * part + i], byte_of(p, call, static_cast<size_t>(r) * part + i));
    }
  });
}

TEST_P(Loopback, MismatchedViewsAreRefusedOnEveryRank) {
  const int n = GetParam();
  if (n == 1) GTEST_SKIP() << "one rank cannot disagree with itself";
  on_ranks(n, [&](int r, Communicator& c) {
    // The last rank sends one byte more than the others.
    const size_t bytes = 8 + (r == n - 1 ? 1 : 0);
    std::vector<uint8_t> send(bytes, 1), recv(bytes * static_cast<size_t>(n), 0);
    Status s = c.all_gather(TensorView(send.data(), DType::u8, {static_cast<int64_t>(bytes)}),
                            TensorView(recv.data(), DType::u8, {static_cast<int64_t>(recv.size())}));
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("rank " + std::to_string(n - 1)), std::string::npos) << s.message();
    // The group is still usable after a refused call.
    std::vector<uint8_t> a(4, static_cast<uint8_t>(r)), b(4 * static_cast<size_t>(n));
    EXPECT_TRUE(c.all_gather(TensorView(a.data(), DType::u8, {4}),
                             TensorView(b.data(), DType::u8, {static_cast<int64_t>(b.size())}))
                    .ok());
    for (int p = 0; p < n; ++p) EXPECT_EQ(b[static_cast<size_t>(p) * 4], p);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Loopback, ::testing::Values(1, 2, 4, 7));

}  // namespace
