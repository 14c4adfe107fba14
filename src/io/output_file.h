// Output files: one policy for every file LayerStream writes (-o tensors, --json
// reports, --memory-plot pictures, make-model checkpoints).
//
//   - a new path or an existing regular file: written to a temporary file beside it,
//     flushed, then renamed over it (atomic: a failed or interrupted run leaves the old
//     file or nothing, never a half-written one);
//   - a symbolic link: followed; its final target is replaced as above (the link stays);
//   - a character device (/dev/null, a terminal): written through, no temporary file,
//     nothing renamed or deleted;
//   - anything else (directory, FIFO, socket, block device), a missing parent directory
//     or a parent we cannot write: refused with a message naming the path and why.
//
// check_output_path() applies the same rules without writing, so a command can refuse a
// bad -o / --json before any work starts. SafetensorsWriter (io/safetensors.h) resolves
// its target with it too, so streamed tensor files follow the same policy.
// The temporary file is "<target>.tmp-<pid>-<n>" (SafetensorsWriter: "<target>.tmp-<pid>");
// only SIGKILL can leave one behind, beside an untouched target. docs/files.md has the
// table of cases and messages.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace ls::io {

// How writing to `path` would go, resolved now (symlinks followed).
struct OutputTarget {
  std::string path;          // as the caller gave it
  std::string resolved;      // final path written or replaced (symlinks followed)
  bool write_through = false;  // character device: written in place, no rename
};

// Refuses a path that write_output_file() would refuse (ErrorCode::io for a missing or
// unwritable parent, ErrorCode::invalid_argument for a directory / FIFO / socket / block
// device). `what` names the flag in the message ("-o", "--json").
Expected<OutputTarget> check_output_path(const std::string& path, std::string_view what);

// An output may never be one of the run's inputs (issue 28, item 1: `-o` naming the
// --model replaced it). Every input that exists is identified by device and inode after
// every symbolic link (so a link, a hard link or "./x" vs "x" is the same file), and every
// output that exists likewise; an output that is an input, or two outputs that are one
// file, are refused (ErrorCode::invalid_argument, naming both flags and paths). An input
// text may carry a suffix (--lora FILE:STRENGTH, --keyframe FILE@FRAME): when the whole
// text names no file, the text before the last ':' or '@' is tried. Character devices
// (/dev/null) written through are never compared.
struct NamedPath {
  std::string flag;  // "-o", "--model"
  std::string path;  // as given
};
Status check_outputs_against_inputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// Writes `bytes` to `path` under the policy above.
Status write_output_file(const std::string& path, std::string_view bytes, std::string_view what);

// Several outputs of one run published together (issue 28, item 5: `-o` and `--json`
// must never come from different runs). add() checks a path under the policy above and
// returns where the caller writes it: a fresh temporary file beside the target
// ("<target>.tmp-<pid>-<n>", written with any writer of this policy, which itself writes
// it atomically), or the path itself for a character device (written through at once).
// publish() renames every temporary file over its target, in the order added, after the
// last one is complete; until then every target is untouched. The destructor removes
// every temporary file not published (a failed or interrupted write leaves nothing).
class StagedOutputs {
 public:
  StagedOutputs() = default;
  ~StagedOutputs();
  StagedOutputs(const StagedOutputs&) = delete;
  StagedOutputs& operator=(const StagedOutputs&) = delete;
  Expected<std::string> add(const std::string& path, std::string_view what);
  Status publish();

 private:
  struct Item {
    std::string path, what, target, tmp;
    bool write_through = false;
  };
  std::vector<Item> items_;
  bool published_ = false;
};

}  // namespace ls::io
