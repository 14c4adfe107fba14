// Golden parity of every backend op against PyTorch (tests/data/golden/ops_v1.safetensors,
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
//
// Runs on the CPU backend always and on "cuda" when the build and the machine have one
// (skipped otherwise): inputs are staged into an arena on the backend's device with
// Backend::copy, results copied back, so the same code checks every backend.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "reference/golden_compare.h"

namespace ls {
namespace {

using golden::Err;
using golden::Owned;

class GoldenOps : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    if (reader_ != nullptr || !open_error_.empty()) return;
    auto r = SafetensorsReader::open(golden::golden_path("ops_v1.safetensors"));
    if (!r.ok()) {
      open_error_ = r.error().message;
      return;
    }
    reader_ = std::move(r).value().release();  // kept for the process (shared by backends)
    format_error_ = golden::check_format(*reader_);
    if (!format_error_.empty()) return;
    cases_ = nlohmann::json::parse(golden::meta(*reader_, "cases"));
    std::printf("golden ops: %s, torch %s on %s, attention backend %s\n", reader_->path().c_str(),
                golden::meta(*reader_, "torch").c_str(), golden::meta(*reader_, "cuda_device").c_str(),
                golden::meta(*reader_, "attention_backend").c_str());
  }
  void SetUp() override {
    ASSERT_TRUE(open_error_.empty()) << open_error_ << "; " << golden::kRegenerate;
    ASSERT_TRUE(format_error_.empty()) << format_error_;
    auto b = make_backend(GetParam());
    if (!b.ok()) {
      ASSERT_NE(GetParam(), "cpu") << b.error().message;
      GTEST_SKIP() << "no " << GetParam() << " backend here: " << b.error().message;
    }
    backend_ = std::move(b).value();
    // The largest case needs < 1 MiB; the backend's workspace (64 MiB on CUDA) comes on top.
    auto a = Arena::create(backend_->memory(), (64ull << 20) + backend_->workspace_bytes());
    ASSERT_TRUE(a.ok()) << a.error().message;
    arena_ = std::move(a).value();
    if (const size_t ws = backend_->workspace_bytes(); ws > 0) {
      auto p = arena_->alloc_bytes(ws, "backend workspace");
      ASSERT_TRUE(p.ok()) << p.error().message;
      ASSERT_TRUE(backend_->set_workspace(TensorView(*p, DType::u8, {static_cast<int64_t>(ws)}, backend_->device())).ok());
    }
    std::printf("backend %s\n", backend_->name().c_str());
  }

  const SafetensorsReader& r() const { return *reader_; }

  // A tensor of the given shape in the backend's arena (device memory).
  TensorView alloc(DType t, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto p = arena_->alloc_bytes(static_cast<size_t>(std::max<int64_t>(n, 1) * dtype_size(t)), "golden tensor");
    LS_CHECK_MSG(p.ok(), p.error().message);
    return TensorView::contiguous(*p, t, shape.data(), static_cast<int>(shape.size()), backend_->device());
  }
  // A golden input copied onto the backend's device.
  TensorView input(const std::string& c, const std::string& name) {
    const SafetensorsEntry* e = r().find(c + "." + name);
    LS_CHECK_MSG(e != nullptr, "golden file lacks " + c + "." + name);
    Owned host = golden::copy_of(r(), *e);
    // A pass must never be vacuous: every float input has a non-zero norm.
    if (dtype_is_float(host.view.dtype)) {
      EXPECT_GT(golden::sum_squares(golden::to_f64(host.view)), 0.0) << c << "." << name;
    }
    TensorView dev = alloc(host.view.dtype, e->shape.empty() ? std::vector<int64_t>{1} : e->shape);
    Status s = backend_->copy(dev, host.view);
    LS_CHECK_MSG(s.ok(), s.message());
    return dev;
  }
  // A device view's contents on the host.
  Owned fetch(const TensorView& dev) {
    Owned host(dev.dtype, std::vector<int64_t>(dev.shape.begin(), dev.shape.begin() + dev.ndim));
    Status s = backend_->copy(host.view, dev);
    LS_CHECK_MSG(s.ok(), s.message());
    s = backend_->synchronize();
    LS_CHECK_MSG(s.ok(), s.message());
    return host;
  }
  bool has(const std::string& c, const std::string& name) const { return r().find(c + "." + name) != nullptr; }
  std::vector<double> stored(const std::string& c, const std::string& name) {
    const SafetensorsEntry* e = r().find(c + "." + name);
    LS_CHECK_MSG(e != nullptr, "golden file lacks " + c + "." + name);
    return golden::to_f64(r().view(*e));
  }
  TensorView like_out(const std::string& c) {
    const SafetensorsEntry* e = r().find(c + ".out");
    LS_CHECK(e != nullptr);
    return alloc(e->dtype, e->shape);
  }

  // Compares the device result `dev` with the stored outputs, prints one line, applies
  // the bounds. max_differing: for ops with the same rounding points as PyTorch and no
  // long reductions, the fraction of bf16 outputs allowed to differ from PyTorch's
  // (each by at most one ulp). A missing or extra rounding point changes far more
  // elements, which the 2x-vs-float64 rule alone would not notice. Negative = unchecked.
  void check(const std::string& c, const TensorView& dev, double max_differing = -1.0, double ratio = 2.0) {
    Owned got = fetch(dev);
    std::vector<double> a = golden::to_f64(got.view);
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
    if (got.view.dtype == DType::bf16) {
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
    std::printf("  %-22s vs torch: max_abs %.3e rel_l2 %.3e bf16 %-18s | vs exact: ours %.3e/%.3e torch %.3e/%.3e\n",
                c.c_str(), vs_torch.max_abs, vs_torch.rel_l2, ulps.c_str(), cpu_err.max_abs, cpu_err.rel_l2,
                torch_err.max_abs, torch_err.rel_l2);
    EXPECT_LE(cpu_err.max_abs, ratio * torch_err.max_abs + floor_abs) << c << ": max abs error vs float64";
    EXPECT_LE(cpu_err.rel_l2, ratio * torch_err.rel_l2 + floor_rel) << c << ": relative L2 error vs float64";
  }

  // Whether the op ran: an unsupported case is reported and skipped (a backend may
  // restrict e.g. attention to H3's head_dim 128), any other failure fails the test.
  bool ran(const Status& s, const std::string& c) {
    if (s.ok()) return true;
    if (s.error().code == ErrorCode::unsupported && GetParam() != "cpu") {  // the reference runs everything
      std::printf("  %-22s unsupported on %s: %s\n", c.c_str(), backend_->name().c_str(), s.message().c_str());
      return false;
    }
    ADD_FAILURE() << c << ": " << s.message();
    return false;
  }

  // Every case of `op` (exactly `count` of them; 0: any number, EveryOpCovered asks for
  // one): `run` runs the op on the case's inputs and returns its Status and output, which
  // is then compared with PyTorch's (check, max_differing).
  using OpRun = std::function<std::pair<Status, TensorView>(const nlohmann::json& j, const std::string& c)>;
  void run_cases(const std::string& op, size_t count, double max_differing, const OpRun& run) {
    const std::vector<nlohmann::json> cs = cases_of(op);
    if (count > 0) {
      ASSERT_EQ(cs.size(), count) << op;
    }
    for (const auto& j : cs) {
      const std::string c = j["case"];
      const auto [s, out] = run(j, c);
      if (!ran(s, c)) continue;
      check(c, out, max_differing);
    }
  }

  // Cases of one op from the file's "cases" list.
  std::vector<nlohmann::json> cases_of(const std::string& op) const {
    std::vector<nlohmann::json> out;
    for (const auto& c : cases_)
      if (c["op"] == op) out.push_back(c);
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Arena> arena_;
  static inline SafetensorsReader* reader_ = nullptr;
  static inline std::string open_error_, format_error_;
  static inline nlohmann::json cases_;
};

TEST_P(GoldenOps, Gemm) {
  auto cs = cases_of("gemm");
  ASSERT_GE(cs.size(), 4u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    TensorView x = input(c, "x"), w = input(c, "w"), out = like_out(c);
    TensorView bias;
    const bool with_bias = has(c, "bias");
    if (with_bias) bias = input(c, "bias");
    Status s = backend_->gemm(x, w, with_bias ? &bias : nullptr, out);
    if (!ran(s, c)) continue;
    // bf16 out: only the fp32 summation order differs from cuBLAS, so an output can
    // only land on the other bf16 neighbour when it sits near a rounding boundary.
    check(c, out, 0.02);
  }
}

// The elementwise and row ops, in place where the op is (the input then holds the output).
TEST_P(GoldenOps, RmsNorm) {
  run_cases("rms_norm", 0, 0.01, [&](const nlohmann::json& j, const std::string& c) {
    TensorView x = input(c, "x"), w = input(c, "w"), out = like_out(c);
    return std::pair{backend_->rms_norm(x, w, j["eps"].get<float>(), out), out};
  });
}

TEST_P(GoldenOps, Modulate) {
  run_cases("modulate", 3, 0.01, [&](const nlohmann::json&, const std::string& c) {
    TensorView in = input(c, "in"), shift = input(c, "shift"), scale = input(c, "scale"), rows = input(c, "rows");
    TensorView out = like_out(c);
    return std::pair{backend_->modulate(in, shift, scale, rows, out), out};
  });
}

TEST_P(GoldenOps, GatedAdd) {
  run_cases("gated_add", 2, 0.01, [&](const nlohmann::json&, const std::string& c) {
    TensorView x = input(c, "x"), y = input(c, "y"), gate = input(c, "gate"), rows = input(c, "rows");
    return std::pair{backend_->gated_add(x, y, gate, rows), x};  // in place on x
  });
}

TEST_P(GoldenOps, Add) {
  run_cases("add", 0, 0.01, [&](const nlohmann::json&, const std::string& c) {
    TensorView x = input(c, "x"), y = input(c, "y");
    return std::pair{backend_->add(x, y), x};  // in place on x
  });
}

TEST_P(GoldenOps, QkNormRope) {
  run_cases("qk_norm_rope", 3, 0.01, [&](const nlohmann::json& j, const std::string& c) {
    TensorView x = input(c, "x"), w = input(c, "w");
    TensorView rope;
    if (has(c, "rope")) rope = input(c, "rope");  // else: empty view = no rotation
    return std::pair{backend_->qk_norm_rope(x, w, rope, j["eps"].get<float>()), x};  // in place
  });
}

TEST_P(GoldenOps, Swiglu) {
  run_cases("swiglu", 0, 0.01, [&](const nlohmann::json&, const std::string& c) {
    TensorView u = input(c, "u"), out = like_out(c);
    return std::pair{backend_->swiglu(u, out), out};
  });
}

TEST_P(GoldenOps, Silu) {
  run_cases("silu", 0, -1.0, [&](const nlohmann::json&, const std::string& c) {
    TensorView x = input(c, "x");
    return std::pair{backend_->silu(x), x};  // in place, fp32
  });
}

TEST_P(GoldenOps, TimeEmbedding) {
  run_cases("time_embedding", 2, -1.0, [&](const nlohmann::json&, const std::string& c) {
    TensorView t = input(c, "t"), out = like_out(c);
    return std::pair{backend_->time_embedding(t, out), out};
  });
}

TEST_P(GoldenOps, ConvertIsBitExact) {
  auto cs = cases_of("convert");
  ASSERT_EQ(cs.size(), 2u);
  for (const auto& j : cs) {
    std::string c = j["case"];
    TensorView x = input(c, "x"), out = like_out(c);
    Status s = backend_->convert(x, out);
    if (!ran(s, c)) continue;
    // Round to nearest even, inf and NaN kept: PyTorch's bytes exactly, except that a
    // NaN only has to stay a NaN (payloads may differ).
    Owned host = fetch(out);
    std::vector<double> a = golden::to_f64(host.view), ref = stored(c, "out");
    ASSERT_EQ(a.size(), ref.size());
    int64_t mismatches = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      bool same = std::isnan(ref[i]) ? std::isnan(a[i]) : (a[i] == ref[i] && std::signbit(a[i]) == std::signbit(ref[i]));
      if (!same) {
        ++mismatches;
        ADD_FAILURE() << c << "[" << i << "]: ours " << a[i] << " torch " << ref[i];
      }
    }
    std::printf("  %-22s %zu values, %lld differ from torch (ties, subnormals, inf, NaN included)\n", c.c_str(),
                a.size(), static_cast<long long>(mismatches));
  }
}

// The attention paths a backend has, each at the kv_tiles it is meant for. CPU: one
// path, kv_tile 1024 (one tile at these sizes) and 16 (many tiles, last one partial).
// CUDA: the native kernel at 1024 and 16; the cuDNN path (where built) at 1024 and its
// default 8192. The cuDNN path rounds each tile's output to bf16 before the merge, so
// its error grows with the number of tiles: at kv_tile 16 the "sharp" case measured
// 1.08e-2 max abs against the 2x bound of 1.05e-2 (H200, 2026-11-30); tiles that small
// are not what that path is for (docs/cuda.md). All are held to the same bound.
struct AttentionRun {
  const char* path;  // Numerics::attention ("native", "cudnn"), or null: the backend's default
  int64_t kv_tile;
};

TEST_P(GoldenOps, Attention) {
  auto cs = cases_of("attention");
  ASSERT_GE(cs.size(), 3u);
  std::vector<AttentionRun> runs = {{nullptr, 1024}, {nullptr, 16}};
  if (GetParam() == "cuda") runs = {{"native", 1024}, {"native", 16}, {"cudnn", 1024}, {"cudnn", 8192}};
  const Numerics before = backend_->numerics();
  for (const AttentionRun& run : runs) {
    // The path is a numerics setting of the backend (set_numerics), never the environment.
    Numerics n;
    if (run.path) n.attention = parse_attention(run.path).value();
    if (Status s = backend_->set_numerics(n, {}); !s.ok()) {
      ASSERT_EQ(s.error().code, ErrorCode::unsupported) << s.message();
      std::printf("  (%s not in this build: %s)\n", run.path, s.message().c_str());
      continue;
    }
    if (run.path) {
      ASSERT_EQ(to_string(backend_->numerics().attention), std::string(run.path));
    }
    for (const auto& j : cs) {
      std::string c = j["case"];
      TensorView q = input(c, "q"), k = input(c, "k"), v = input(c, "v");
      TensorView out = like_out(c);
      AttentionParams p;
      p.kv_tile = run.kv_tile;
      Status s = backend_->attention(q, k, v, out, p);
      if (!ran(s, c)) continue;
      std::printf("  (%s, kv_tile %lld)\n", run.path ? run.path : "attention", static_cast<long long>(run.kv_tile));
      check(c, out);
    }
  }
  ASSERT_TRUE(backend_->set_numerics(before, {}).ok());
}

// Every case in the file belongs to an op one of the tests above runs (so a new golden
// case cannot be silently ignored), and every computing op of backend.h has a case.
TEST_P(GoldenOps, EveryOpCovered) {
  const std::set<std::string> tested = {"gemm", "rms_norm", "modulate", "gated_add", "add", "qk_norm_rope",
                                        "swiglu", "silu", "time_embedding", "convert", "attention"};
  std::set<std::string> ops;
  for (const auto& c : cases_) {
    EXPECT_TRUE(tested.count(c["op"].get<std::string>())) << "golden case of an op no test runs: " << c;
    ops.insert(c["op"].get<std::string>());
  }
  for (const auto& op : tested) EXPECT_TRUE(ops.count(op)) << "no golden case for op " << op;
}

INSTANTIATE_TEST_SUITE_P(Backends, GoldenOps, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace ls
