// The output-file policy (io/output_file.h): where a path leads, and how bytes get there.
//
// Why not always temp file + rename: rename() replaces whatever the path names. Run as
// root (the GPU machines, most containers), `-o /dev/null` would delete the device node
// and leave a regular file in its place. So the path is classified first (lstat, then
// symlinks followed by hand, so that a dangling link names the file to create) and only
// regular files and new paths are replaced atomically.
#include "io/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace ls::io {

namespace {

// Symbolic links followed before giving up (the kernel's own limit is 40).
constexpr int kMaxSymlinkHops = 40;

std::string parent_dir(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string label(std::string_view what, const std::string& path) {
  std::string s(what);
  if (!s.empty()) s += ' ';
  return s + path;
}

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISBLK(m)) return "a block device";
  return "not a regular file";
}

// The temporary file for `resolved`: beside it (same directory, so rename() stays on one
// filesystem), unique per process and call.
std::string temp_name(const std::string& resolved) {
  static std::atomic<unsigned> counter{0};
  return resolved + ".tmp-" + std::to_string(static_cast<long>(getpid())) + "-" +
         std::to_string(counter.fetch_add(1));
}

Status write_all(int fd, std::string_view bytes, const std::string& where) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    ssize_t k = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (k < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      return make_error(ErrorCode::io, "cannot write " + where + ": " + std::strerror(e) +
                                           (e == ENOSPC || e == EFBIG ? " (disk full or file size limit)" : ""));
    }
    if (k == 0) return make_error(ErrorCode::io, "cannot write " + where + ": no progress");
    p += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

}  // namespace

Expected<OutputTarget> check_output_path(const std::string& path, std::string_view what) {
  if (path.empty()) return make_error(ErrorCode::invalid_argument, std::string(what) + ": empty output path");
  OutputTarget t;
  t.path = path;
  // First what the path leads to as the kernel sees it (every link followed, also the
  // /proc/self/fd magic links behind /dev/stdout, which readlink() cannot resolve when
  // they name a pipe). Anything but a regular file is decided here.
  struct stat fst {};
  if (::stat(path.c_str(), &fst) == 0 && !S_ISREG(fst.st_mode)) {
    if (S_ISCHR(fst.st_mode)) {
      t.resolved = path;  // opened through the links; the device is written in place
      t.write_through = true;
      return t;
    }
    return make_error(ErrorCode::invalid_argument, "refusing to write " + label(what, path) + ": " + path + " is " +
                                                       std::string(kind_of(fst.st_mode)) +
                                                       "; give a file name (a regular file or a new path)");
  }
  // A regular file or nothing yet: find the final target by hand, so that the
  // temporary file goes beside it and the rename replaces it, not a link to it (a
  // dangling link names the file to create).
  std::string cur = path;
  struct stat st {};
  bool exists = false;
  for (int hop = 0;; ++hop) {
    if (::lstat(cur.c_str(), &st) != 0) {
      int e = errno;
      if (e != ENOENT && e != ENOTDIR)  // ENOTDIR: a parent is a file, said below
        return make_error(ErrorCode::io, "cannot write " + label(what, path) + ": " + cur + ": " + std::strerror(e));
      break;  // a new file (or a dangling link's target): the parent decides
    }
    if (!S_ISLNK(st.st_mode)) {
      exists = true;
      break;
    }
    if (hop >= kMaxSymlinkHops)
      return make_error(ErrorCode::io, "cannot write " + label(what, path) + ": more than " +
                                           std::to_string(kMaxSymlinkHops) + " symbolic links to follow (a loop?)");
    std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 255) + 1, '\0');
    ssize_t n = ::readlink(cur.c_str(), target.data(), target.size());
    if (n < 0) {
      int e = errno;
      return make_error(ErrorCode::io, "cannot read symbolic link " + cur + " (" + label(what, path) + "): " +
                                           std::strerror(e));
    }
    target.resize(static_cast<size_t>(n));
    cur = (!target.empty() && target[0] == '/') ? target : parent_dir(cur) + "/" + target;
  }
  t.resolved = cur;
  const std::string via = cur == path ? std::string() : " (the target of symbolic link " + path + ")";

  if (exists) {
    if (S_ISCHR(st.st_mode)) {
      t.write_through = true;  // /dev/null, a terminal: written in place, never replaced
      return t;
    }
    if (!S_ISREG(st.st_mode))
      return make_error(ErrorCode::invalid_argument, "refusing to write " + label(what, path) + ": " + cur + via +
                                                         " is " + kind_of(st.st_mode) +
                                                         "; give a file name (a regular file or a new path)");
  }
  // New path or regular file: the temporary file goes in the same directory, so the
  // directory must exist and take new files.
  const std::string dir = parent_dir(cur);
  struct stat dst {};
  if (::stat(dir.c_str(), &dst) != 0) {
    int e = errno;
    return make_error(ErrorCode::io, "cannot write " + label(what, path) + via + ": directory " + dir +
                                         (e == ENOENT ? " does not exist" : std::string(": ") + std::strerror(e)));
  }
  if (!S_ISDIR(dst.st_mode))
    return make_error(ErrorCode::io, "cannot write " + label(what, path) + via + ": " + dir + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    int e = errno;
    return make_error(ErrorCode::io, "cannot write " + label(what, path) + via + ": cannot create files in " +
                                         dir + ": " + std::strerror(e));
  }
  return t;
}

namespace {

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};

// The file `path` names after every link, if it exists and is not a character device.
bool file_id(const std::string& path, FileId& id) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISCHR(st.st_mode)) return false;
  id = {st.st_dev, st.st_ino};
  return true;
}

}  // namespace

Status check_outputs_against_inputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  struct Seen {
    FileId id;
    const NamedPath* p;
  };
  std::vector<Seen> ins;
  for (const NamedPath& in : inputs) {
    FileId id;
    if (in.path.empty()) continue;
    if (file_id(in.path, id)) {
      ins.push_back({id, &in});
      continue;
    }
    // FILE:STRENGTH, FILE@FRAME: the text before the suffix.
    const size_t cut = in.path.find_last_of(":@");
    if (cut != std::string::npos && cut > 0 && file_id(in.path.substr(0, cut), id)) ins.push_back({id, &in});
  }
  std::vector<std::pair<std::string, const NamedPath*>> seen_resolved;  // outputs so far
  std::vector<Seen> outs;
  for (const NamedPath& out : outputs) {
    LS_ASSIGN_OR_RETURN(OutputTarget t, check_output_path(out.path, out.flag));
    if (t.write_through) continue;
    for (const auto& [r, prev] : seen_resolved)
      if (r == t.resolved)
        return make_error(ErrorCode::invalid_argument,
                          prev->flag + " and " + out.flag + " name the same file (" + out.path + ")");
    seen_resolved.emplace_back(t.resolved, &out);
    FileId id;
    if (!file_id(t.resolved, id)) continue;  // a new file: no input can be it
    for (const Seen& in : ins)
      if (in.id == id)
        return make_error(ErrorCode::invalid_argument,
                          "refusing to write " + out.flag + " " + out.path + ": it is the same file as " +
                              in.p->flag + " " + in.p->path +
                              " (an input of this run; writing it would replace the input): give another output path");
    for (const Seen& o : outs)
      if (o.id == id)
        return make_error(ErrorCode::invalid_argument,
                          o.p->flag + " and " + out.flag + " name the same file (" + out.path + ")");
    outs.push_back({id, &out});
  }
  return {};
}

Status write_output_file(const std::string& path, std::string_view bytes, std::string_view what) {
  LS_ASSIGN_OR_RETURN(OutputTarget t, check_output_path(path, what));
  const std::string where = label(what, path);

  if (t.write_through) {
    // O_NONBLOCK for the open only: if the node changed into a FIFO since the check,
    // the open must not wait for a reader. Then fstat makes sure it is what we checked.
    int fd = ::open(t.resolved.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      int e = errno;
      return make_error(ErrorCode::io, "cannot open " + where + ": " + std::strerror(e));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISCHR(st.st_mode)) {
      ::close(fd);
      return make_error(ErrorCode::io, "cannot write " + where + ": it changed while being opened");
    }
    int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // a terminal may need to wait
    Status s = write_all(fd, bytes, where);
    if (::close(fd) != 0 && s.ok()) {
      int e = errno;
      s = make_error(ErrorCode::io, "cannot write " + where + ": closing: " + std::strerror(e));
    }
    return s;
  }

  // Atomic replace: temporary file beside the target, fsync, rename. O_EXCL: never
  // write into a file someone else is writing.
  const std::string tmp = temp_name(t.resolved);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) {
    int e = errno;
    return make_error(ErrorCode::io, "cannot create " + tmp + " (temporary file for " + where +
                                         "): " + std::strerror(e));
  }
  auto fail = [&](Status s) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  };
  Status s = write_all(fd, bytes, where + " (temporary file " + tmp + ")");
  if (!s.ok()) return fail(s);
  // Durable before visible: `path` is always the old file or the complete new one.
  if (::fsync(fd) != 0) {
    int e = errno;
    return fail(make_error(ErrorCode::io, "cannot write " + where + ": syncing " + tmp + ": " + std::strerror(e)));
  }
  int cfd = fd;
  fd = -1;
  if (::close(cfd) != 0) {
    int e = errno;
    return fail(make_error(ErrorCode::io, "cannot write " + where + ": closing " + tmp + ": " + std::strerror(e)));
  }
  if (::rename(tmp.c_str(), t.resolved.c_str()) != 0) {
    int e = errno;
    return fail(make_error(ErrorCode::io, "cannot rename " + tmp + " to " + t.resolved + " (" + where +
                                              "): " + std::strerror(e)));
  }
  // Make the rename itself durable (best effort: the file is complete either way).
  int dfd = ::open(parent_dir(t.resolved).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

StagedOutputs::~StagedOutputs() {
  if (published_) return;
  for (const Item& it : items_)
    if (!it.write_through) ::unlink(it.tmp.c_str());
}

Expected<std::string> StagedOutputs::add(const std::string& path, std::string_view what) {
  LS_ASSIGN_OR_RETURN(OutputTarget t, check_output_path(path, what));
  Item it;
  it.path = path;
  it.what = std::string(what);
  it.target = t.resolved;
  it.write_through = t.write_through;
  it.tmp = t.write_through ? t.resolved : temp_name(t.resolved);
  items_.push_back(it);
  return it.write_through ? path : it.tmp;
}

Status StagedOutputs::publish() {
  if (published_) return make_error(ErrorCode::invalid_argument, "StagedOutputs::publish() called twice");
  // Every staged file must exist (the caller wrote it) before any target changes.
  for (const Item& it : items_) {
    struct stat st {};
    if (!it.write_through && ::lstat(it.tmp.c_str(), &st) != 0)
      return make_error(ErrorCode::io, "cannot write " + label(it.what, it.path) + ": its temporary file " + it.tmp +
                                           " was not written");
  }
  for (size_t i = 0; i < items_.size(); ++i) {
    const Item& it = items_[i];
    if (it.write_through) continue;
    if (::rename(it.tmp.c_str(), it.target.c_str()) != 0) {
      int e = errno;
      // The ones before are in place; the rest are removed by the destructor.
      for (size_t k = 0; k < i; ++k) items_[k].write_through = true;  // renamed: nothing to remove
      return make_error(ErrorCode::io, "cannot rename " + it.tmp + " to " + it.target + " (" +
                                           label(it.what, it.path) + "): " + std::strerror(e));
    }
    int dfd = ::open(parent_dir(it.target).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
  }
  published_ = true;
  return {};
}

}  // namespace ls::io
