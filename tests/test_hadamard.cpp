// The ConvRot fast Hadamard transform (core/hadamard.h): the matrix it applies, its
// exact values on small inputs, and the groups it accepts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/hadamard.h"

using namespace ls;

namespace {

// H_G[i][j] in double: the product over base-4 digits of h4[d_i][d_j], times 1/sqrt(G).
double h_entry(int64_t G, int64_t i, int64_t j) {
  static const int h4[4][4] = {{1, 1, 1, -1}, {1, 1, -1, 1}, {1, -1, 1, 1}, {-1, 1, 1, 1}};
  double e = 1;
  for (int64_t g = G; g > 1; g /= 4, i /= 4, j /= 4) e *= h4[i % 4][j % 4];
  return e / std::sqrt(static_cast<double>(G));
}

}  // namespace

TEST(Hadamard, GroupsAccepted) {
  for (int64_t G : {4, 16, 64, 256, 1024, 4096}) EXPECT_TRUE(hadamard_group_ok(G)) << G;
  for (int64_t G : {0, 1, 2, 8, 32, 128, 512, 16384, -4}) EXPECT_FALSE(hadamard_group_ok(G)) << G;
}

TEST(Hadamard, UnitVectorsGiveTheRowsOfH4) {
  // e_d * H_4 = row d of h4 / 2: every value exact.
  const float want[4][4] = {{0.5f, 0.5f, 0.5f, -0.5f}, {0.5f, 0.5f, -0.5f, 0.5f},
                            {0.5f, -0.5f, 0.5f, 0.5f}, {-0.5f, 0.5f, 0.5f, 0.5f}};
  for (int d = 0; d < 4; ++d) {
    float v[4] = {0, 0, 0, 0}, tmp[4];
    v[d] = 1;
    hadamard_f32(v, tmp, 4);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(v[j], want[d][j]) << d << "," << j;
  }
}

TEST(Hadamard, AppliesTheKroneckerMatrixAndIsAnInvolution) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (int64_t G : {16, 64, 256}) {
    std::vector<float> x(static_cast<size_t>(G)), v, tmp(static_cast<size_t>(G));
    for (float& f : x) f = nd(rng);
    v = x;
    hadamard_f32(v.data(), tmp.data(), G);
    double err = 0, norm = 0;
    for (int64_t j = 0; j < G; ++j) {
      double e = 0;
      for (int64_t i = 0; i < G; ++i) e += static_cast<double>(x[static_cast<size_t>(i)]) * h_entry(G, i, j);
      err = std::max(err, std::abs(e - v[static_cast<size_t>(j)]));
      norm = std::max(norm, std::abs(e));
    }
    EXPECT_LT(err, 1e-5 * norm * std::sqrt(static_cast<double>(G))) << "G = " << G;
    // H_G is symmetric and orthogonal: applying it twice gives x back (to rounding).
    hadamard_f32(v.data(), tmp.data(), G);
    for (int64_t i = 0; i < G; ++i) EXPECT_NEAR(v[static_cast<size_t>(i)], x[static_cast<size_t>(i)], 1e-5 * norm);
  }
}
