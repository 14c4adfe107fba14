// Golden parity of every CPU op against PyTorch (tests/data/golden/ops_v1.safetensors,
// written by tests/reference/h3_reference.py on an H200: cuBLAS GEMMs with fp32
// accumulation, TF32 off, FlashAttention-2 SDPA, the rounding points of h3-model.md §3).
//
// For each case the file holds the inputs, PyTorch's output ("<case>.out") and the same
// math in float64 without any rounding ("<case>.exact"). The test runs the CPU op on the
// stored inputs and prints, per case: the distance to PyTorch (max abs, relative L2,
// bf16 ulps), and both implementations' error against the exact result. The bound is
// DESIGN.md §4's: err(cpu, exact) <= 2 * err(torch, exact) + floor, for max abs and
// relative L2 (floor: one fp32 ulp of the output scale, so exactly-computed cases compare
// exactly). Conversions must agree bit for bit (NaN payloads aside).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "reference/golden_compare.h"

namespace ls {
namespace {

using golden::Err;
using golden::Owned;

class GoldenOps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto r = SafetensorsReader::open(golden::golden_path("ops_v1.safetensors"));
    if (!r.ok()) {
      open_error_ = r.error().message;
      return;
    }
    reader_ = std::move(r).value().release();
    format_error_ = golden::check_format(*reader_);
    if (!format_error_.empty()) return;
    cases_ = nlohmann::json::parse(golden::meta(*reader_, "cases"));
    std::printf("golden ops: %s, torch %s on %s, attention backend %s\n", reader_->path().c_str(),
                golden::meta(*reader_, "torch").c_str(), golden::meta(*reader_, "cuda_device").c_str(),
                golden::meta(*reader_, "attention_backend").c_str());
  }
  static void TearDownTestSuite() {
    delete reader_;
    reader_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(open_error_.empty()) << open_error_ << "; " << golden::kRegenerate;
    ASSERT_TRUE(format_error_.empty()) << format_error_;
    backend_ = make_cpu_backend();
  }

  const SafetensorsReader& r() const { return *reader_; }

  Owned input(const std::string& c, const std::string& name) {
    const SafetensorsEntry* e = r().find(c + "." + name);
    LS_CHECK_MSG(e != nullptr, "golden file lacks " + c + "." + name);
    Owned o = golden::copy_of(r(), *e);
    // A pass must never be vacuous: every float input has a non-zero norm.
    if (dtype_is_float(o.view.dtype)) {
      EXPECT_GT(golden::sum_squares(golden::to_f64(o.view)), 0.0) << c << "." << name;
    }
    return o;
  }
  bool has(const std::string& c, const std::string& name) const { return r().find(c + "." + name) != nullptr; }
  std::vector<double> stored(const std::string& c, const std::string& name) {
    const SafetensorsEntry* e = r().find(c + "." + name);
    LS_CHECK_MSG(e != nullptr, "golden file lacks " + c + "." + name);
    return golden::to_f64(r().view(*e));
  }
  Owned like_out(const std::string& c) {
    const SafetensorsEntry* e = r().find(c + ".out");
    LS_CHECK(e != nullptr);
    return Owned(e->dtype, e->shape);
  }

  // Compares `got` with the stored outputs, prints one line, applies the bound.
  // max_differing: for ops with the same rounding points as PyTorch and no long
  // reductions, the fraction of bf16 outputs allowed to differ from PyTorch's (each by
  // at most one ulp). A missing or extra rounding point changes far more elements, which
  // the 2x-vs-float64 rule alone would not notice. Negative = not checked.
  void check(const std::string& c, const TensorView& got, double max_differing = -1.0, double ratio = 2.0) {
    std::vector<double> a = golden::to_f64(got);
    std::vector<double> torch_out = stored(c, "out");
    std::vector<double> exact = stored(c, "exact");
    ASSERT_EQ(a.size(), torch_out.size()) << c;
    Err vs_torch = golden::error(a, torch_out);
    Err cpu_err = golden::error(a, exact);
    Err torch_err = golden::error(torch_out, exact);
    double scale = 0;
    for (double x : exact)
      if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
    const double floor_abs = scale * 0x1p-23;  // one fp32 ulp of the output scale
    const double floor_rel = 0x1p-23;
    std::string ulps = "-";
    if (got.dtype == DType::bf16) {
      golden::UlpStats u = golden::ulp_stats(a, torch_out);
      if (max_differing >= 0) {
        EXPECT_LE(static_cast<double>(u.differing), max_differing * static_cast<double>(a.size()))
            << c << ": too many outputs differ from PyTorch (same rounding points expected)";
        EXPECT_LE(u.max_ulps, 1.0) << c << ": an output differs from PyTorch by more than one bf16 ulp";
      }
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.1f ulp (%lld/%zu)", u.max_ulps, static_cast<long long>(u.differing), a.size());
      ulps = buf;
    }
    std::printf("  %-22s vs torch: max_abs %.3e rel_l2 %.3e bf16 %-18s | vs exact: cpu %.3e/%.3e torch %.3e/%.3e\n",
                c.c_str(), vs_torch.max_abs, vs_torch.rel_l2, ulps.c_str(), cpu_err.max_abs, cpu_err.rel_l2,
                torch_err.max_abs, torch_err.rel_l2);
    EXPECT_LE(cpu_err.max_abs, ratio * torch_err.max_abs + floor_abs) << c << ": max abs error vs float64";
    EXPECT_LE(cpu_err.rel_l2, ratio * torch_err.rel_l2 + floor_rel) << c << ": relative L2 error vs float64";
  }

  // Cases of one op from the file's "cases" list.
  std::vector<nlohmann::json> cases_of(const std::string& op) const {
    std::vector<nlohmann::json> out;
    for (const auto& c : cases_)
      if (c["op"] == op) out.push_back(c);
    return out;
  }

  std::unique_ptr<Backend> backend_;
  static inline SafetensorsReader* reader_ = nullptr;
  static inline std::string open_error_, format_error_;
  static inline nlohmann::json cases_;
};

TEST_F(GoldenOps, Gemm) {
  auto cs = cases_of("gemm");
  ASSERT_GE(cs.size(), 4u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    Owned x = input(c, "x"), w = input(c, "w"), out = like_out(c);
    Owned bias;
    const bool with_bias = has(c, "bias");
    if (with_bias) bias = input(c, "bias");
    Status s = backend_->gemm(x.view, w.view, with_bias ? &bias.view : nullptr, out.view);
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    // bf16 out: only the fp32 summation order differs from cuBLAS, so an output can
    // only land on the other bf16 neighbour when it sits near a rounding boundary.
    check(c, out.view, 0.02);
  }
}

TEST_F(GoldenOps, RmsNorm) {
  for (const auto& j : cases_of("rms_norm")) {
    std::string c = j["case"];
    Owned x = input(c, "x"), w = input(c, "w"), out = like_out(c);
    Status s = backend_->rms_norm(x.view, w.view, j["eps"].get<float>(), out.view);
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    check(c, out.view, 0.01);
  }
}

TEST_F(GoldenOps, Modulate) {
  auto cs = cases_of("modulate");
  ASSERT_EQ(cs.size(), 3u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    Owned in = input(c, "in"), shift = input(c, "shift"), scale = input(c, "scale"), rows = input(c, "rows");
    Owned out = like_out(c);
    Status s = backend_->modulate(in.view, shift.view, scale.view, rows.view, out.view);
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    check(c, out.view, 0.01);
  }
}

TEST_F(GoldenOps, GatedAdd) {
  auto cs = cases_of("gated_add");
  ASSERT_EQ(cs.size(), 2u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    Owned x = input(c, "x"), y = input(c, "y"), gate = input(c, "gate"), rows = input(c, "rows");
    Status s = backend_->gated_add(x.view, y.view, gate.view, rows.view);  // in place on x
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    check(c, x.view, 0.01);
  }
}

TEST_F(GoldenOps, Add) {
  for (const auto& j : cases_of("add")) {
    std::string c = j["case"];
    Owned x = input(c, "x"), y = input(c, "y");
    Status s = backend_->add(x.view, y.view);  // in place on x
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    check(c, x.view, 0.01);
  }
}

TEST_F(GoldenOps, QkNormRope) {
  auto cs = cases_of("qk_norm_rope");
  ASSERT_EQ(cs.size(), 3u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    Owned x = input(c, "x"), w = input(c, "w");
    Owned rope;
    if (has(c, "rope")) rope = input(c, "rope");  // else: empty view = no rotation
    Status s = backend_->qk_norm_rope(x.view, w.view, rope.view, j["eps"].get<float>());  // in place
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    check(c, x.view, 0.01);
  }
}

TEST_F(GoldenOps, Swiglu) {
  for (const auto& j : cases_of("swiglu")) {
    std::string c = j["case"];
    Owned u = input(c, "u"), out = like_out(c);
    Status s = backend_->swiglu(u.view, out.view);
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    check(c, out.view, 0.01);
  }
}

TEST_F(GoldenOps, Silu) {
  for (const auto& j : cases_of("silu")) {
    std::string c = j["case"];
    Owned x = input(c, "x");
    Status s = backend_->silu(x.view);  // in place, fp32
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    check(c, x.view);
  }
}

TEST_F(GoldenOps, TimeEmbedding) {
  auto cs = cases_of("time_embedding");
  ASSERT_EQ(cs.size(), 2u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    Owned t = input(c, "t"), out = like_out(c);
    Status s = backend_->time_embedding(t.view, out.view);
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    check(c, out.view);
  }
}

TEST_F(GoldenOps, ConvertIsBitExact) {
  auto cs = cases_of("convert");
  ASSERT_EQ(cs.size(), 2u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    Owned x = input(c, "x"), out = like_out(c);
    Status s = backend_->convert(x.view, out.view);
    ASSERT_TRUE(s.ok()) << c << ": " << s.message();
    // Round to nearest even, inf and NaN kept: PyTorch's bytes exactly, except that a
    // NaN only has to stay a NaN (payloads may differ).
    std::vector<double> a = golden::to_f64(out.view), ref = stored(c, "out");
    ASSERT_EQ(a.size(), ref.size());
    int64_t mismatches = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      bool same = std::isnan(ref[i]) ? std::isnan(a[i]) : (a[i] == ref[i] && std::signbit(a[i]) == std::signbit(ref[i]));
      if (!same) {
        ++mismatches;
        ADD_FAILURE() << c << "[" << i << "]: cpu " << a[i] << " torch " << ref[i];
      }
    }
    std::printf("  %-22s %zu values, %lld differ from torch (ties, subnormals, inf, NaN included)\n", c.c_str(),
                a.size(), static_cast<long long>(mismatches));
  }
}

TEST_F(GoldenOps, Attention) {
  auto cs = cases_of("attention");
  ASSERT_GE(cs.size(), 3u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    Owned q = input(c, "q"), k = input(c, "k"), v = input(c, "v");
    // kv_tile 1024 (one tile at these sizes) and 16 (many tiles, last one partial):
    // both are held to the same bound against float64.
    for (int64_t tile : {int64_t{1024}, int64_t{16}}) {
      Owned out = like_out(c);
      AttentionParams p;
      p.kv_tile = tile;
      Status s = backend_->attention(q.view, k.view, v.view, out.view, p);
      ASSERT_TRUE(s.ok()) << c << ": " << s.message();
      std::printf("  (kv_tile %lld)\n", static_cast<long long>(tile));
      check(c, out.view);
    }
  }
}

// Every case in the file belongs to an op one of the tests above runs (so a new golden
// case cannot be silently ignored), and every computing op of backend.h has a case.
TEST_F(GoldenOps, EveryOpCovered) {
  const std::set<std::string> tested = {"gemm", "rms_norm", "modulate", "gated_add", "add", "qk_norm_rope",
                                        "swiglu", "silu", "time_embedding", "convert", "attention"};
  std::set<std::string> ops;
  for (const auto& c : cases_) {
    EXPECT_TRUE(tested.count(c["op"].get<std::string>())) << "golden case of an op no test runs: " << c;
    ops.insert(c["op"].get<std::string>());
  }
  for (const auto& op : tested) EXPECT_TRUE(ops.count(op)) << "no golden case for op " << op;
}

}  // namespace
}  // namespace ls
