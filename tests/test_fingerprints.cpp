// Pinned output fingerprints on the CPU backend (tests/fingerprint_cases.h): fixed
// synthetic weights and inputs, hashes recorded in tests/data/fingerprints.json
// ("cpu"). A change of any of them is a deliberate act recorded in docs/numerics.md
// ("Fingerprint changes") with the reason; the test prints the observed values in the
// file's format. The CUDA values: tests/cuda/test_fingerprints_cuda.cpp.
#include "fingerprint_cases.h"

#include "core/thread_pool.h"

namespace ls::test::fingerprint {
namespace {

TEST(Fingerprints, CpuMatchesRecorded) {
  auto be = make_cpu_backend();
  check_section("cpu", *be);
}

// The CPU bytes never depend on the thread count, so one thread gives the recorded
// values too (a cheap subset: the tiny forward cases).
TEST(Fingerprints, CpuOneThreadMatchesRecorded) {
  const auto want = recorded("cpu");
  const int threads = num_threads();
  set_num_threads(1);
  auto be = make_cpu_backend();
  for (const Case& c : cases()) {
    if (c.preset != "tiny" || c.steps > 0) continue;
    auto h = run_case(c, *be);
    ASSERT_TRUE(h.ok()) << h.error().message;
    auto it = want.find(c.name);
    ASSERT_TRUE(it != want.end() && !it->second.empty()) << c.name << " is not recorded";
    EXPECT_EQ(hex(*h), it->second) << c.name << " on 1 thread";
  }
  set_num_threads(threads);
}

}  // namespace
}  // namespace ls::test::fingerprint
