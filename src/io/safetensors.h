// safetensors reading (mmap, validated against hostile files) and writing (streamed,
// atomic: temporary file + rename).
//
// File format: u64 little-endian header length N, N bytes of JSON
//   {"__metadata__": {"k": "v", ...}, "name": {"dtype": "BF16", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// then the data section; offsets are relative to the data section's start.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace ls {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
  int64_t numel() const;
};

class SafetensorsReader {
 public:
  // Header limit: 100 MB (the format's reference implementation uses the same).
  static constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;

  // Maps the file read-only and validates everything (see the .cpp for the list).
  // Anything but a regular file (directory, FIFO, device, socket) is refused before it
  // is opened, and opened without blocking (a FIFO cannot make us wait for a writer).
  static Expected<std::unique_ptr<SafetensorsReader>> open(const std::string& path);
  // The same validation over bytes in memory (fuzz targets, tests). The bytes are
  // copied into the reader; `name` stands for the path in messages and path().
  static Expected<std::unique_ptr<SafetensorsReader>> from_bytes(const void* bytes, size_t n,
                                                                 std::string name = "<memory>");
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // file order (by offset)
  const SafetensorsEntry* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const void* data(const SafetensorsEntry& e) const;
  // A read-only host view of the tensor (at most kMaxDims dims; scalars become [1]).
  // More dims is a caller bug (LS_CHECK); try_view() says so as an error instead.
  // The view may be misaligned for its dtype when the file's writer did not order
  // tensors by element size: read such a tensor with memcpy from data().
  TensorView view(const SafetensorsEntry& e) const;
  // Like view(), but refuses (with a message naming the tensor) more than kMaxDims
  // dims and data that is not aligned to the element size in memory.
  Expected<TensorView> try_view(const SafetensorsEntry& e) const;
  // Whether the tensor's first byte is aligned to its element size in memory.
  bool is_aligned(const SafetensorsEntry& e) const;
  uint64_t file_size() const { return size_; }
  uint64_t data_start() const { return data_start_; }  // file offset of the data section
  // Tensors of a valid safetensors dtype LayerStream does not handle (I64, BOOL, U16,
  // F8_E5M2, ...): validated like the others but not in entries(); "name (I64 [3])".
  const std::vector<std::string>& unsupported_tensors() const { return unsupported_; }

 private:
  SafetensorsReader() = default;
  // Validates base_[0, size_) and fills the tables (shared by open and from_bytes).
  static Expected<std::unique_ptr<SafetensorsReader>> parse(std::unique_ptr<SafetensorsReader> r);
  std::string path_;
  void* map_ = nullptr;                 // open(): the read-only mapping (unmapped on destruction)
  std::vector<unsigned char> owned_;    // from_bytes(): the copy
  const unsigned char* base_ = nullptr;  // the file's first byte (map_ or owned_)
  uint64_t size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::string> unsupported_;
};

// Streamed writer: declare every tensor first (the header must know all offsets),
// then write their bytes in declaration order, possibly in pieces, then commit().
// Tensors lie in the data section back to back in declaration order (no gaps, as
// the reference reader requires); the header is padded with spaces to a multiple of
// 8 bytes, so every tensor is aligned to its element size when tensors are declared
// in order of decreasing element size (write_safetensors() orders them so).
// A write() must not cross the end of the current tensor (that catches a wrong byte
// count per tensor); zero-size tensors need no write.
// Every failure is a Status with a message; after an I/O failure the writer refuses
// further calls and the destructor cleans up.
// Where the bytes go follows the output-file policy of io/output_file.h, checked by
// begin() through io::check_output_path(): for a new path or a regular file, writes go
// to "<target>.tmp-<pid>" beside it and commit() renames over the target after fsync
// (a symbolic link is followed and its final target replaced; the link stays); if the
// writer is destroyed without commit() (error, exception, ^C path), the temporary file
// is removed and the target is untouched. A character device (/dev/null) is written
// through, never replaced. A directory, FIFO, socket, block device or missing parent
// directory is refused by begin() with a message.
class SafetensorsWriter {
 public:
  // `what` names the output in messages ("-o"); empty: the path alone.
  explicit SafetensorsWriter(std::string path, std::string what = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void set_metadata(const std::string& key, const std::string& value);
  Status declare(const std::string& name, DType dtype, const std::vector<int64_t>& shape);
  // Writes the header; call after every declare().
  Status begin();
  // Appends bytes of the current tensor; tensors must be completed in declaration order.
  Status write(const void* bytes, size_t n);
  // Convenience: declare-order write of a whole tensor.
  Status write_tensor(const std::string& name, const void* bytes, size_t n);
  Status commit();

 private:
  struct Decl { std::string name; DType dtype; std::vector<int64_t> shape; uint64_t bytes; };
  std::string path_, what_;
  std::string target_;    // the final file written (symlinks followed), set by begin()
  std::string tmp_path_;  // where the bytes go until commit(); target_ when write_through_
  bool write_through_ = false;  // character device: no temporary file, no rename
  std::map<std::string, std::string> metadata_;
  std::vector<Decl> decls_;
  size_t current_ = 0;
  uint64_t written_in_current_ = 0;
  int fd_ = -1;
  bool begun_ = false, committed_ = false;
  // Added: the first I/O failure (every later call repeats it), whether the temporary
  // file exists (and is ours to remove), the total data size, and a write buffer so
  // that many small pieces cost few system calls.
  Status failed_;
  bool tmp_created_ = false;
  uint64_t data_bytes_ = 0;
  uint64_t data_written_ = 0;
  std::vector<char> buffer_;
  Status flush_buffer();
  Status write_fully(const void* bytes, size_t n);
  Status fail_io(const std::string& what, int err);
  void skip_complete_tensors();
};

// Writes a set of host tensors (contiguous views) in one go (for small outputs).
// The file lists them by decreasing element size (stable otherwise), so every tensor
// is aligned in the file; a view that is not contiguous or not on the host is an
// invalid_argument error.
struct NamedTensor { std::string name; TensorView view; };
Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace ls
