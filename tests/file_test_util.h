// Helpers of the file tests (safetensors, output files): whole-file read and write, a
// safetensors file from values, a file size limit for a scope, and a temporary-folder
// fixture.
#pragma once

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "io/safetensors.h"

namespace ls::test {

inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

// One tensor of a file write_tensors writes: values.size() is the shape's element count
// (one value for shape {}), stored with the dtype's rounding; a non-float dtype (the
// refusal tests') is written as zero bytes.
struct TensorValues {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using NamedTensors = std::vector<std::pair<std::string, TensorValues>>;

// A safetensors file of `tensors`, declared and written in their order (fatal test
// failures).
inline void write_tensors(const std::string& path, const NamedTensors& tensors) {
  SafetensorsWriter w(path);
  for (const auto& [name, t] : tensors) ASSERT_TRUE(w.declare(name, t.dtype, t.shape).ok()) << name;
  ASSERT_TRUE(w.begin().ok());
  for (const auto& [name, t] : tensors) {
    std::vector<unsigned char> bytes(t.values.size() * static_cast<size_t>(dtype_size(t.dtype)));
    if (dtype_is_float(t.dtype))
      for (size_t i = 0; i < t.values.size(); ++i) store_from_f32(bytes.data(), t.dtype, static_cast<int64_t>(i), t.values[i]);
    ASSERT_TRUE(w.write_tensor(name, bytes.data(), bytes.size()).ok()) << name;
  }
  ASSERT_TRUE(w.commit().ok());
}
// The same in name order.
inline void write_tensors(const std::string& path, const std::map<std::string, TensorValues>& tensors) {
  write_tensors(path, NamedTensors(tensors.begin(), tensors.end()));
}

// n normal values (mean 0, standard deviation `scale`) drawn in order from mt19937(seed).
inline std::vector<float> randoms(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = nd(rng);
  return v;
}

// Runs fn with the file size limit (RLIMIT_FSIZE) at `bytes` and SIGXFSZ ignored, so that
// a write past it fails with EFBIG (a full disk's stand-in) instead of killing the
// process; the old limit and handler are back afterwards.
template <typename Fn>
void with_file_size_limit(rlim_t bytes, const Fn& fn) {
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = bytes;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
  fn();
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  signal(SIGXFSZ, old_handler);
}

// A fixture with a fresh temporary folder per test (removed afterwards): file(name) is a
// path inside it, listing() its file names sorted (to prove no temporary file is left).
class TempDirTest : public ::testing::Test {
 protected:
  explicit TempDirTest(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix_ + "_XXXXXX")).string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace ls::test
