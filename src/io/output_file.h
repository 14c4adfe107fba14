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

// Writes `bytes` to `path` under the policy above.
Status write_output_file(const std::string& path, std::string_view bytes, std::string_view what);

}  // namespace ls::io
