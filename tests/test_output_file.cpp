// The output-file policy (io/output_file.h), through both writers that follow it:
// io::write_output_file (JSON reports, plots) and SafetensorsWriter / write_safetensors
// (tensor files, checkpoints). Each node kind is made in a temporary folder (mknod as
// root), never the system's own /dev/null.
//
// Before the policy, SafetensorsWriter renamed its temporary file over whatever the path
// named: a character device, FIFO or symbolic link was replaced by a regular file (as
// root, `-o /dev/null` deleted the device node) and a directory failed only at commit(),
// after all the work. Those cases fail here against that writer.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "file_test_util.h"
#include "io/output_file.h"
#include "io/safetensors.h"

namespace ls {
namespace {

namespace fs = std::filesystem;

class OutputFileTest : public test::TempDirTest {
 protected:
  OutputFileTest() : TempDirTest("ls_output_file") {}
  void SetUp() override {
    TempDirTest::SetUp();
    // A FIFO must never make a test hang: if something opens one and waits, the alarm
    // kills the test binary (a failure, not a stuck CI job).
    alarm(60);
  }
  void TearDown() override {
    alarm(0);
    TempDirTest::TearDown();
  }
  // A character device node like /dev/null (1, 3) in our folder; as a non-root user,
  // the system's /dev/null (which we cannot delete anyway).
  std::string null_device() const {
    std::string p = file("null");
    if (mknod(p.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) return p;
    return "/dev/null";
  }
};

using ls::test::read_all;
using ls::test::write_all;

bool has(const Status& s, const std::string& text) { return !s.ok() && s.message().find(text) != std::string::npos; }

bool is_char_device(const std::string& p) {
  struct stat st {};
  return lstat(p.c_str(), &st) == 0 && S_ISCHR(st.st_mode);
}

// A small tensor file through the streaming writer; returns begin()'s or commit()'s status.
Status write_tensor_file(const std::string& path, uint8_t fill = 7) {
  std::vector<uint8_t> bytes(100, fill);
  return write_safetensors(path, {{"t", TensorView(bytes.data(), DType::u8, {100})}});
}

TEST_F(OutputFileTest, NewPathAndRegularFileAreReplacedAtomically) {
  const std::string p = file("report.json");
  Expected<io::OutputTarget> t = io::check_output_path(p, "--json");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_FALSE(t->write_through);
  EXPECT_EQ(t->resolved, p);
  ASSERT_TRUE(io::write_output_file(p, "{\"a\": 1}\n", "--json").ok());
  EXPECT_EQ(read_all(p), "{\"a\": 1}\n");
  ASSERT_TRUE(io::write_output_file(p, "second", "--json").ok());
  EXPECT_EQ(read_all(p), "second");
  ASSERT_TRUE(io::write_output_file(p, "", "--json").ok());  // empty is a valid file
  EXPECT_EQ(fs::file_size(p), 0u);
  EXPECT_EQ(listing(), std::vector<std::string>{"report.json"});  // no temporary file left
  // A path without a directory part lands in the current directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  Status s = io::write_output_file("plain.txt", "x", "--json");
  fs::current_path(cwd);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(read_all(file("plain.txt")), "x");
}

TEST_F(OutputFileTest, CharacterDeviceIsWrittenThroughAndSurvives) {
  const std::string dev = null_device();
  ASSERT_TRUE(is_char_device(dev));
  Expected<io::OutputTarget> t = io::check_output_path(dev, "-o");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_TRUE(t->write_through);
  ASSERT_TRUE(io::write_output_file(dev, std::string(1 << 20, 'x'), "--json").ok());
  EXPECT_TRUE(is_char_device(dev));
  // The streaming tensor writer: the bug of issue 11 (as root, -o /dev/null deleted the
  // device node and left a regular file in its place).
  Status s = write_tensor_file(dev);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(is_char_device(dev)) << dev << " was replaced";
  // No temporary file was made beside it.
  for (const std::string& name : listing()) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
  // A symbolic link to the device: followed, the device written through, the link kept.
  const std::string link = file("to_null");
  fs::create_symlink(dev, link);
  ASSERT_TRUE(write_tensor_file(link).ok());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_TRUE(is_char_device(dev));
}

TEST_F(OutputFileTest, WriteErrorOnADeviceIsReported) {
  // /dev/full (1, 7) refuses every write with ENOSPC: the error comes back, the node stays.
  std::string full = file("full");
  if (mknod(full.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0) full = "/dev/full";
  if (!is_char_device(full)) GTEST_SKIP() << "no /dev/full";
  Status s = io::write_output_file(full, "abc", "--json");
  EXPECT_TRUE(has(s, "No space left")) << s.message();
  EXPECT_EQ(s.error().code, ErrorCode::io);
  s = write_tensor_file(full);
  EXPECT_TRUE(has(s, "No space left")) << s.message();
  EXPECT_TRUE(is_char_device(full));
}

TEST_F(OutputFileTest, FifoIsRefusedWithoutBlocking) {
  const std::string fifo = file("pipe");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0666), 0);
  Expected<io::OutputTarget> t = io::check_output_path(fifo, "-o");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(t.error().message.find("-o " + fifo), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("is a FIFO (named pipe)"), std::string::npos) << t.error().message;
  EXPECT_TRUE(has(io::write_output_file(fifo, "abc", "--json"), "is a FIFO"));
  Status s = write_tensor_file(fifo);
  EXPECT_TRUE(has(s, "is a FIFO")) << s.message();
  struct stat st {};
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "the FIFO was replaced";
  EXPECT_EQ(listing(), std::vector<std::string>{"pipe"});
  // An anonymous pipe through its /proc/self/fd link (what /dev/stdout is under `| cat`):
  // readlink() gives "pipe:[N]", which names no file; it is refused as the FIFO it is.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string via_proc = "/proc/self/fd/" + std::to_string(fds[1]);
  Status p = io::write_output_file(via_proc, "abc", "--json");
  EXPECT_TRUE(has(p, via_proc + " is a FIFO (named pipe)")) << p.message();
  close(fds[0]);
  close(fds[1]);
}

TEST_F(OutputFileTest, DirectoryIsRefusedBeforeAnyWork) {
  const std::string d = file("out");
  fs::create_directory(d);
  Expected<io::OutputTarget> t = io::check_output_path(d, "-o");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, ErrorCode::invalid_argument);
  EXPECT_NE(t.error().message.find(d + " is a directory"), std::string::npos) << t.error().message;
  EXPECT_TRUE(has(io::write_output_file(d, "abc", "--json"), "is a directory"));
  // The streaming writer refuses at begin(), before any tensor byte is computed or
  // written (it used to fail only at commit()'s rename).
  SafetensorsWriter w(d, "-o");
  ASSERT_TRUE(w.declare("t", DType::u8, {4}).ok());
  Status s = w.begin();
  EXPECT_TRUE(has(s, "is a directory")) << s.message();
  EXPECT_TRUE(has(s, "-o " + d)) << s.message();
  EXPECT_TRUE(fs::is_directory(d));
  EXPECT_TRUE(fs::is_empty(d));
  EXPECT_EQ(listing(), std::vector<std::string>{"out"});
}

TEST_F(OutputFileTest, SocketAndBlockDeviceAreRefused) {
  const std::string sock = file("sock");
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr {};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof(addr.sun_path));
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_TRUE(has(io::write_output_file(sock, "abc", "--json"), "is a socket"));
  EXPECT_TRUE(has(write_tensor_file(sock), "is a socket"));
  EXPECT_TRUE(fs::is_socket(sock));
  close(fd);
  // A block device node (loop0's numbers; nothing is ever opened): root only.
  const std::string blk = file("blk");
  if (mknod(blk.c_str(), S_IFBLK | 0600, makedev(7, 0)) == 0) {
    EXPECT_TRUE(has(io::write_output_file(blk, "abc", "--json"), "is a block device"));
    EXPECT_TRUE(has(write_tensor_file(blk), "is a block device"));
    EXPECT_TRUE(fs::is_block_file(blk));
  }
}

TEST_F(OutputFileTest, SymlinkIsFollowedAndItsTargetReplaced) {
  const std::string target = file("real.safetensors");
  write_all(target, "old");
  fs::create_directory(file("links"));
  // A relative link in another folder, then a link to that link: both followed.
  const std::string link1 = file("links/one");
  const std::string link2 = file("two");
  fs::create_symlink("../real.safetensors", link1);
  fs::create_symlink("links/one", link2);
  Expected<io::OutputTarget> t = io::check_output_path(link2, "-o");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(fs::weakly_canonical(t->resolved), fs::weakly_canonical(target));
  Status s = write_tensor_file(link2, 9);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_TRUE(fs::is_symlink(link1));
  EXPECT_TRUE(fs::is_symlink(link2)) << "the link was replaced by a file";
  auto r = SafetensorsReader::open(target);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(static_cast<const uint8_t*>((*r)->data((*r)->entries()[0]))[0], 9);
  ASSERT_TRUE(io::write_output_file(link2, "json", "--json").ok());
  EXPECT_EQ(read_all(target), "json");
  EXPECT_TRUE(fs::is_symlink(link2));
  // A dangling link names the file to create.
  const std::string dangling = file("dangling");
  fs::create_symlink("made.json", dangling);
  ASSERT_TRUE(io::write_output_file(dangling, "new", "--json").ok());
  EXPECT_TRUE(fs::is_symlink(dangling));
  EXPECT_EQ(read_all(file("made.json")), "new");
  // A link to a directory is refused like the directory; a loop is refused.
  fs::create_symlink("links", file("to_dir"));
  EXPECT_TRUE(has(io::write_output_file(file("to_dir"), "x", "--json"), "is a directory"));
  fs::create_symlink("loop_b", file("loop_a"));
  fs::create_symlink("loop_a", file("loop_b"));
  EXPECT_TRUE(has(io::write_output_file(file("loop_a"), "x", "--json"), "symbolic links"));
  EXPECT_TRUE(has(write_tensor_file(file("loop_a")), "symbolic links"));
  for (const std::string& name : listing()) EXPECT_EQ(name.find(".tmp-"), std::string::npos) << name;
}

TEST_F(OutputFileTest, MissingOrBadParentIsRefused) {
  const std::string p = file("no/such/dir/report.json");
  Expected<io::OutputTarget> t = io::check_output_path(p, "--json");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, ErrorCode::io);
  EXPECT_NE(t.error().message.find("--json " + p), std::string::npos) << t.error().message;
  EXPECT_NE(t.error().message.find("directory " + file("no/such/dir") + " does not exist"), std::string::npos)
      << t.error().message;
  EXPECT_TRUE(has(io::write_output_file(p, "x", "--json"), "does not exist"));
  EXPECT_TRUE(has(write_tensor_file(p), "does not exist"));
  write_all(file("plain"), "x");
  EXPECT_TRUE(has(io::write_output_file(file("plain/report.json"), "x", "--json"), "is not a directory"));
  // A dangling link into a missing folder: the folder of the link's target is named.
  fs::create_symlink("gone/x.json", file("into_gone"));
  EXPECT_TRUE(has(io::write_output_file(file("into_gone"), "x", "--json"), "does not exist"));
  EXPECT_FALSE(io::check_output_path("", "-o").ok());
  EXPECT_EQ(listing(), (std::vector<std::string>{"into_gone", "plain"}));
}

TEST_F(OutputFileTest, InterruptedWriteLeavesNothing) {
  // A file size limit stops the write midway (EFBIG; SIGXFSZ ignored so that write()
  // returns the error instead of killing us): a new path stays absent, an existing
  // file keeps its old bytes, and no temporary file is left.
  const std::string fresh = file("fresh.json");
  const std::string existing = file("existing.json");
  write_all(existing, "previous");
  const std::string big(1u << 20, 'z');
  Status s1, s2;
  ASSERT_NO_FATAL_FAILURE(test::with_file_size_limit(1u << 16, [&] {
    s1 = io::write_output_file(fresh, big, "--json");
    s2 = io::write_output_file(existing, big, "--json");
  }));
  EXPECT_TRUE(has(s1, "disk full or file size limit")) << s1.message();
  EXPECT_TRUE(has(s2, "disk full or file size limit")) << s2.message();
  EXPECT_FALSE(fs::exists(fresh));
  EXPECT_EQ(read_all(existing), "previous");
  EXPECT_EQ(listing(), std::vector<std::string>{"existing.json"});

  // A process killed in the middle of a streamed tensor file: the target is untouched
  // (only the temporary file beside it can remain after SIGKILL).
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    SafetensorsWriter w(existing);
    std::vector<uint8_t> bytes(1 << 20, 3);
    if (!w.declare("t", DType::u8, {4 << 20}).ok() || !w.begin().ok()) _exit(2);
    if (!w.write(bytes.data(), bytes.size()).ok()) _exit(3);
    raise(SIGKILL);
    _exit(4);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "child exited with " << WEXITSTATUS(status);
  EXPECT_EQ(read_all(existing), "previous");
}

}  // namespace
}  // namespace ls
