// Model files as the commands open them (h3::open_h3_checkpoint, which every command
// uses for --model / info FILE): the hostile inputs of issue 11 on a real checkpoint,
// the committed tiny golden model. Before the fixes, the FIFO blocked forever and both
// byte-level corruptions below loaded "fine" (one shifted every tensor by a byte).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "model/h3/checkpoint.h"

namespace ls {
namespace {

namespace fs = std::filesystem;

const std::string kGolden = std::string(LS_TEST_DATA_DIR) + "/golden/h3_golden_tiny.safetensors";

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class ModelFileInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ls_model_inputs_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    alarm(60);  // a blocking open kills the binary: a failure, not a hung CI job
  }
  void TearDown() override {
    alarm(0);
    fs::remove_all(dir_);
  }
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (dir_ / name).string();
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  static std::string refusal(const std::string& path) {
    auto r = h3::open_h3_checkpoint(path);
    return r.ok() ? std::string("(accepted)") : r.error().message;
  }
  fs::path dir_;
};

TEST_F(ModelFileInputs, TheGoldenCheckpointLoads) {
  auto r = h3::open_h3_checkpoint(kGolden);
  ASSERT_TRUE(r.ok()) << r.error().message;
}

TEST_F(ModelFileInputs, TrailingByteIsRefused) {
  const std::string p = write("trailing.safetensors", read_all(kGolden) + "x");
  const std::string msg = refusal(p);
  EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find("1 trailing bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("belong to no tensor"), std::string::npos) << msg;
}

TEST_F(ModelFileInputs, HeaderLengthIntoThePaddingIsRefused) {
  // The golden file's header is padded with spaces to a multiple of 8: one byte less
  // in the length still parses as JSON, and every tensor moves one byte.
  std::string bytes = read_all(kGolden);
  ASSERT_GT(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
  ASSERT_EQ(bytes[8 + n - 1], ' ') << "the golden header has no padding to step into";
  --n;
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  const std::string p = write("shifted.safetensors", bytes);
  const std::string msg = refusal(p);
  EXPECT_NE(msg.find("seems to stop inside the header's padding, which shifts every tensor by 1 byte(s)"),
            std::string::npos)
      << msg;
}

TEST_F(ModelFileInputs, FifoAndDirectoryAreRefused) {
  const std::string fifo = (dir_ / "pipe.safetensors").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0666), 0);
  std::string msg = refusal(fifo);
  EXPECT_NE(msg.find(fifo + ": is a FIFO (named pipe), not a regular file"), std::string::npos) << msg;
  msg = refusal(dir_.string());
  EXPECT_NE(msg.find(dir_.string() + ": is a directory, not a regular file"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ls
