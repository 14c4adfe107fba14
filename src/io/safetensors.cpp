// safetensors reader and writer. docs/safetensors.md lists what the reader validates
// and how the writer stays atomic.
//
// Reader checks, each with its own message (naming the file and, where one is
// concerned, the tensor):
//   file shorter than 8 bytes; header length over kMaxHeaderBytes or over the rest of
//   the file; JSON syntax (nlohmann's message, with its byte position); keys repeated
//   in one JSON object (nlohmann keeps the last silently: a SAX pass sees every
//   key); nesting deeper than kMaxJsonDepth; header not an object; __metadata__ not an
//   object of strings; entry not an object; dtype, shape, data_offsets missing or of
//   the wrong JSON type; unknown dtype (a valid safetensors dtype we do not handle is
//   listed in unsupported_tensors() instead of failing the file); shape dims negative,
//   not integers or beyond int64; element count beyond int64; byte count beyond
//   uint64; data_offsets not two ascending non-negative integers; byte range length
//   != element count x element size; byte range past the data section; then, as the
//   reference implementation does, the data section must be covered exactly by the
//   tensors' byte ranges: two ranges overlapping (an empty tensor inside another's
//   range included), a gap before or between tensors, trailing bytes after the last
//   one (with a hint when the header length stops inside the header's padding).
//   Non-regular files (directory, FIFO, device, socket) are refused before opening.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <new>
#include <unordered_set>
#include <nlohmann/json.hpp>

#include "core/arena.h"  // format_bytes
#include "io/mapping_guard.h"
#include "io/output_file.h"

namespace ls {

namespace {

using json = nlohmann::json;

// Our structure needs depth 3 (header object > entry object > shape array); a little
// room for foreign metadata, and a hostile "[[[[..." stops early.
constexpr int kMaxJsonDepth = 64;

// Valid safetensors dtypes LayerStream does not handle, with their element sizes so
// their byte ranges can still be validated. Sub-byte types (F4, F6_*) are absent:
// their byte length cannot be checked the same way, so a file holding them fails as
// "unknown dtype".
struct ForeignDType { const char* name; int size; };
constexpr ForeignDType kForeignDTypes[] = {
    {"BOOL", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
    {"U32", 4},  {"I64", 8},     {"U64", 8},     {"C64", 8},
};

// A name or key quoted for a message: bytes outside printable ASCII become \xNN and
// very long names are cut, so a hostile header cannot garble a terminal or a log.
std::string quote_name(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out = "'";
  size_t n = std::min<size_t>(s.size(), 200);
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > n) out += "...";
  out += "'";
  return out;
}

// Any text for a message with bytes outside printable ASCII as \xNN: nlohmann's parse
// errors quote the bytes they stopped at ("last read: '...'"), which in a hostile
// header can be anything (found by fuzz/fuzz_safetensors).
std::string printable(const std::string& s) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string json_text(const json& j) {
  // Values that passed the parser are valid UTF-8, so dump() cannot throw here;
  // ensure_ascii escapes everything else as \uXXXX. Cut long ones (a 10 MB array in a
  // message helps no one).
  std::string s = j.dump(-1, ' ', /*ensure_ascii=*/true);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// First pass over the header text: syntax (nlohmann's message), repeated keys and
// nesting depth, without building anything. nlohmann keeps only the last of repeated
// keys, which would hide a tensor listed twice, so the keys are checked here.
// (Not done with nlohmann's parser callback: its end_object scans the parent object
// for discarded values, which is quadratic in the number of tensors.)
class HeaderScan final : public nlohmann::json_sax<json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return enter();
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool key(string_t& k) override {
    if (keys_.back().insert(k).second) return true;
    if (keys_.size() == 1) error = "tensor " + quote_name(k) + ": listed twice in the header (duplicate name)";
    else error = "key " + quote_name(k) + " appears twice in one JSON object of the header";
    return false;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) override {
    error = "header is not valid JSON: " + printable(ex.what());
    return false;
  }
  std::string error;  // set when the scan stops

 private:
  bool enter() {
    if (++depth_ <= kMaxJsonDepth) return true;
    error = "header JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return false;
  }
  std::vector<std::unordered_set<std::string>> keys_;  // one per open object
  int depth_ = 0;
};

// A JSON value that must be a non-negative integer (shape dim, data offset). Sets
// `out` or returns what is wrong with it, e.g. "is negative (-3)".
std::string read_unsigned(const json& v, uint64_t& out) {
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    return {};
  }
  if (v.is_number_integer()) return "is negative (" + json_text(v) + ")";
  if (v.is_number_float()) return "is not an integer (" + json_text(v) + ")";
  return std::string("is not a number (it is a ") + v.type_name() + ")";
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated at open: cannot overflow
  return n;
}

SafetensorsReader::~SafetensorsReader() {
  if (map_) {
    io::unguard_mapping(map_);
    munmap(map_, size_);
  }
}

namespace {

// What a non-regular file is, for the refusal message.
const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

Error not_regular(const std::string& path, mode_t m) {
  return make_error(ErrorCode::invalid_file,
                    path + ": is " + file_kind(m) + ", not a regular file: a safetensors file is memory-mapped, " +
                        (S_ISDIR(m) ? std::string("give the path of the .safetensors file itself")
                                    : std::string("so it must be a regular file (copy the bytes into one first)")));
}

}  // namespace

Expected<std::unique_ptr<SafetensorsReader>> SafetensorsReader::open(const std::string& path) {
  // Refused before opening: a FIFO would block open() until a writer came, a device
  // might have side effects on open (tapes, terminals).
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int e = errno;
    return make_error(e == ENOENT ? ErrorCode::not_found : ErrorCode::io,
                      "cannot open safetensors file " + path + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) return not_regular(path, st.st_mode);
  // O_NONBLOCK: if the path was swapped for a FIFO since the stat, open() still
  // returns at once and the fstat below refuses it. (No effect on a regular file.)
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    return make_error(e == ENOENT ? ErrorCode::not_found : ErrorCode::io,
                      "cannot open safetensors file " + path + ": " + std::strerror(e));
  }
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return make_error(ErrorCode::io, "cannot stat " + path + ": " + std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return not_regular(path, st.st_mode);
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return make_error(ErrorCode::invalid_file,
                      path + ": file is " + std::to_string(size) +
                          " bytes, shorter than the 8-byte header length that starts a safetensors file");
  }
  // Read-only private mapping: the weights are used in place, never copied; pages come
  // in as they are touched. A file truncated by someone else while mapped faults on
  // access (SIGBUS): the mapping is guarded (io/mapping_guard.h), so such a fault reads
  // zeros and marks the file, and io::check_mapped_files() turns that into an error
  // naming it wherever results leave LayerStream.
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return make_error(ErrorCode::io, "cannot map " + path + " (" + format_bytes(size) + "): " +
                                         std::strerror(map_errno));
  }
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->path_ = path;
  r->map_ = map;
  r->size_ = size;
  r->base_ = static_cast<const unsigned char*>(map);
  io::guard_mapping(map, size, path);
  return parse(std::move(r));
}

Expected<std::unique_ptr<SafetensorsReader>> SafetensorsReader::from_bytes(const void* bytes, size_t n,
                                                                           std::string name) {
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->path_ = std::move(name);
  try {
    r->owned_.assign(static_cast<const unsigned char*>(bytes), static_cast<const unsigned char*>(bytes) + n);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory, r->path_ + ": out of memory copying " + format_bytes(n));
  }
  r->size_ = n;
  r->base_ = r->owned_.data();
  return parse(std::move(r));
}

namespace {

// A tensor's bytes [begin, end) in the data section.
struct Range {
  uint64_t begin, end;
  std::string name;
};

// One tensor's header entry, checked (dtype known or foreign, shape, data_offsets
// spanning exactly its bytes inside the data section of data_size bytes); an error names
// the tensor.
struct HeaderTensor {
  std::optional<DType> dtype;  // nullopt: a foreign dtype (listed as unsupported, not read)
  std::string dtype_str;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};
Expected<HeaderTensor> read_header_tensor(const std::string& path, const std::string& name, const json& v,
                                          uint64_t data_size, const std::string& dtype_list) {
  auto bad = [&](const std::string& msg) {
    return make_error(ErrorCode::invalid_file, path + ": tensor " + quote_name(name) + ": " + msg);
  };
  if (!v.is_object()) return bad(std::string("entry is not a JSON object (it is a ") + v.type_name() + ")");

  // dtype
  auto dt = v.find("dtype");
  if (dt == v.end()) return bad("missing \"dtype\"");
  if (!dt->is_string()) return bad(std::string("\"dtype\" is not a string (it is a ") + dt->type_name() + ")");
  const std::string& dtype_str = dt->get_ref<const std::string&>();
  std::optional<DType> dtype = dtype_from_safetensors_name(dtype_str);
  int elem_size = 0;
  if (dtype) {
    elem_size = dtype_size(*dtype);
  } else {
    for (const auto& f : kForeignDTypes)
      if (dtype_str == f.name) elem_size = f.size;
    if (elem_size == 0) return bad("unknown dtype " + quote_name(dtype_str) + " (supported: " + dtype_list + ")");
  }

  // shape
  auto sh = v.find("shape");
  if (sh == v.end()) return bad("missing \"shape\"");
  if (!sh->is_array()) return bad(std::string("\"shape\" is not an array (it is a ") + sh->type_name() + ")");
  std::vector<int64_t> shape;
  bool has_zero = false;
  for (size_t i = 0; i < sh->size(); ++i) {
    uint64_t d = 0;
    std::string why = read_unsigned((*sh)[i], d);
    if (!why.empty()) return bad("shape[" + std::to_string(i) + "] " + why);
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return bad("shape[" + std::to_string(i) + "] = " + std::to_string(d) + " does not fit in int64");
    shape.push_back(static_cast<int64_t>(d));
    has_zero = has_zero || d == 0;
  }
  int64_t numel = 1;
  if (has_zero) {
    numel = 0;  // [0, 2^62, 2^62] is an empty tensor, not an overflow
  } else {
    for (int64_t d : shape)
      if (__builtin_mul_overflow(numel, d, &numel))
        return bad("shape " + shape_text(shape) + " has more elements than int64 can count");
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(elem_size), &nbytes))
    return bad("byte size of " + dtype_str + " " + shape_text(shape) + " overflows 64 bits");

  // data_offsets
  auto off = v.find("data_offsets");
  if (off == v.end()) return bad("missing \"data_offsets\"");
  if (!off->is_array() || off->size() != 2)
    return bad("\"data_offsets\" is not an array of two integers (it is " + json_text(*off) + ")");
  uint64_t begin = 0, end = 0;
  std::string why = read_unsigned((*off)[0], begin);
  if (!why.empty()) return bad("data_offsets[0] " + why);
  why = read_unsigned((*off)[1], end);
  if (!why.empty()) return bad("data_offsets[1] " + why);
  const std::string range_str = "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (begin > end) return bad("data_offsets " + range_str + " are not ascending");
  if (end - begin != nbytes)
    return bad("data_offsets " + range_str + " span " + std::to_string(end - begin) + " bytes but " + dtype_str +
               " " + shape_text(shape) + " needs " + std::to_string(nbytes) + " bytes");
  if (end > data_size)
    return bad("data_offsets " + range_str + " reach past the end of the data section (" +
               std::to_string(data_size) + " bytes; truncated file?)");

  return HeaderTensor{dtype, dtype_str, std::move(shape), begin, end};
}

// Exact coverage, as the reference implementation requires: taken in offset order,
// each tensor starts where the previous one ends, the first at 0, and the last ends
// at the end of the file. Every byte of the data section then belongs to exactly one
// tensor: no gap, no overlap, nothing after the last tensor. Unindexed bytes are not
// harmless: a header length cut short by one byte (pointing into the header's space
// padding) shifts every tensor by one byte and leaves one byte over at the end, and
// nothing else would notice.
Status check_coverage(const std::string& path, std::vector<Range> ranges, uint64_t data_size, const unsigned char* data,
                      uint64_t header_len) {
  auto invalid = [&](const std::string& msg) { return make_error(ErrorCode::invalid_file, path + ": " + msg); };
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  auto span = [](uint64_t b, uint64_t e) {
    std::string t = "[";  // appended piecewise: GCC 12 warns (-Wrestrict, falsely) on "[" + to_string(b)
    t += std::to_string(b);
    t += ", ";
    t += std::to_string(e);
    t += ")";
    return t;
  };
  uint64_t cursor = 0;          // end of the bytes covered so far
  const Range* last = nullptr;  // the last tensor holding bytes
  for (const Range& rg : ranges) {
    if (rg.begin < cursor) {  // then `last` is set: only a tensor with bytes moves the cursor
      if (rg.begin == rg.end)
        return invalid("tensor " + quote_name(rg.name) + " (empty, data_offsets [" + std::to_string(rg.begin) + ", " +
                       std::to_string(rg.end) + "]) lies inside the bytes " + span(last->begin, last->end) +
                       " of tensor " + quote_name(last->name) + "; each tensor must start where the previous one ends");
      return invalid("tensor " + quote_name(rg.name) + ": bytes " + span(rg.begin, rg.end) + " overlap those of tensor " +
                     quote_name(last->name) + " " + span(last->begin, last->end));
    }
    if (rg.begin > cursor)
      return invalid("tensor " + quote_name(rg.name) + ": bytes " + span(rg.begin, rg.end) + " start " +
                     std::to_string(rg.begin - cursor) + " bytes after " +
                     (last ? "tensor " + quote_name(last->name) + " ends" : std::string("the start of the data section")) +
                     ": bytes " + span(cursor, rg.begin) + " of the data section belong to no tensor (gap; a " +
                     "safetensors data section must be covered exactly by its tensors)");
    if (rg.end > rg.begin) last = &rg;
    cursor = rg.end;
  }
  if (cursor != data_size) {  // cursor < data_size: every end was checked against it
    const uint64_t extra = data_size - cursor;
    std::string msg = std::to_string(extra) + " trailing bytes " + span(cursor, data_size) +
                      " of the data section follow " +
                      (last ? "the last tensor " + quote_name(last->name) + " (which ends at " + std::to_string(cursor) + ")"
                            : std::string("a header that gives no tensor any bytes")) +
                      " and belong to no tensor (a safetensors data section must be covered exactly by its tensors)";
    // The classic cause: the header length stops inside the header's space padding,
    // so the data section starts with those spaces and everything moves by as many bytes.
    uint64_t spaces = 0;
    while (spaces < extra && data[spaces] == ' ') ++spaces;
    if (last && spaces == extra)
      msg += "; the data section starts with " + std::to_string(extra) + " space(s): the header length (" +
             std::to_string(header_len) + ") seems to stop inside the header's padding, which shifts every tensor by " +
             std::to_string(extra) + " byte(s)";
    return invalid(msg);
  }
  return Status();
}

}  // namespace

Expected<std::unique_ptr<SafetensorsReader>> SafetensorsReader::parse(std::unique_ptr<SafetensorsReader> r) {
  const std::string& path = r->path_;
  auto invalid = [&](const std::string& msg) {
    return make_error(ErrorCode::invalid_file, path + ": " + msg);
  };
  const uint64_t size = r->size_;
  if (size < 8)
    return invalid("file is " + std::to_string(size) +
                   " bytes, shorter than the 8-byte header length that starts a safetensors file");
  const unsigned char* bytes = r->base_;

  uint64_t header_len = 0;  // u64 little endian, whatever the host's byte order
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];
  if (header_len > kMaxHeaderBytes) {
    return invalid("header length " + std::to_string(header_len) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes (corrupt file, or not a safetensors file)");
  }
  if (header_len > size - 8) {
    return invalid("header length " + std::to_string(header_len) + " is larger than the " +
                   std::to_string(size - 8) + " bytes that follow it (truncated file?)");
  }
  r->data_start_ = 8 + header_len;
  const uint64_t data_size = size - r->data_start_;

  // Two linear passes: the scan (syntax, duplicates, depth), then the DOM.
  const char* text = reinterpret_cast<const char*>(bytes + 8);
  json root;
  try {
    HeaderScan scan;
    if (!json::sax_parse(text, text + header_len, &scan)) return invalid(scan.error);
    root = json::parse(text, text + header_len);
  } catch (const json::exception& e) {  // not expected after the scan; kept as an error, not a crash
    return invalid("header is not valid JSON: " + printable(e.what()));
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::out_of_memory, path + ": out of memory parsing the " +
                                                    format_bytes(header_len) + " header");
  }
  if (!root.is_object())
    return invalid(std::string("header is not a JSON object (it is a ") + root.type_name() + ")");

  std::string dtype_list;
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::f8e4m3, DType::i8, DType::i32, DType::u8})
    dtype_list += std::string(dtype_list.empty() ? "" : ", ") + dtype_safetensors_name(t);

  std::vector<Range> ranges;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object())
        return invalid(std::string("__metadata__ is not an object of strings (it is a ") + v.type_name() + ")");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          return invalid("__metadata__ is not an object of strings: key " + quote_name(m.key()) + " holds a " +
                         m.value().type_name());
        r->metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    LS_ASSIGN_OR_RETURN(HeaderTensor t, read_header_tensor(path, name, v, data_size, dtype_list));
    ranges.push_back(Range{t.begin, t.end, name});
    if (!t.dtype) {
      r->unsupported_.push_back(name + " (" + t.dtype_str + " " + shape_text(t.shape) + ")");
      continue;
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = *t.dtype;
    e.shape = std::move(t.shape);
    e.begin = t.begin;
    e.end = t.end;
    r->entries_.push_back(std::move(e));
  }

  LS_TRY(check_coverage(path, std::move(ranges), data_size, bytes + r->data_start_, header_len));

  std::sort(r->entries_.begin(), r->entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  for (size_t i = 0; i < r->entries_.size(); ++i) r->index_[r->entries_[i].name] = i;
  return r;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const void* SafetensorsReader::data(const SafetensorsEntry& e) const {
  LS_CHECK_MSG(e.begin <= e.end && e.end <= size_ - data_start_, "entry does not belong to " + path_);
  return reinterpret_cast<const char*>(base_) + data_start_ + e.begin;
}

bool SafetensorsReader::is_aligned(const SafetensorsEntry& e) const {
  return reinterpret_cast<uintptr_t>(data(e)) % static_cast<uintptr_t>(dtype_size(e.dtype)) == 0;
}

TensorView SafetensorsReader::view(const SafetensorsEntry& e) const {
  LS_CHECK_MSG(e.shape.size() <= static_cast<size_t>(kMaxDims),
               "tensor '" + e.name + "' has " + std::to_string(e.shape.size()) + " dims; views hold at most " +
                   std::to_string(kMaxDims) + " (use try_view() to get an error instead)");
  // The mapping is read-only: TensorView has no const flavour, writing through this
  // view faults.
  void* p = const_cast<void*>(data(e));
  if (e.shape.empty()) {
    const int64_t one = 1;  // a scalar becomes [1]
    return TensorView::contiguous(p, e.dtype, &one, 1);
  }
  return TensorView::contiguous(p, e.dtype, e.shape.data(), static_cast<int>(e.shape.size()));
}

Expected<TensorView> SafetensorsReader::try_view(const SafetensorsEntry& e) const {
  if (e.shape.size() > static_cast<size_t>(kMaxDims))
    return make_error(ErrorCode::unsupported, path_ + ": tensor " + quote_name(e.name) + " has " +
                                                  std::to_string(e.shape.size()) + " dims " + shape_text(e.shape) +
                                                  "; LayerStream views hold at most " + std::to_string(kMaxDims));
  if (!is_aligned(e))
    return make_error(ErrorCode::unsupported,
                      path_ + ": tensor " + quote_name(e.name) + " (" + dtype_safetensors_name(e.dtype) +
                          ") starts at file offset " + std::to_string(data_start_ + e.begin) +
                          ", not a multiple of its element size: read it by copying from data()");
  return view(e);
}

// ---------------------------------------------------------------------------------
// Writer

namespace {
constexpr size_t kWriteBufferBytes = 4u << 20;  // pieces smaller than this are batched
}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
  // Not committed: the temporary file goes, `path` was never touched.
  if (tmp_created_ && !committed_) ::unlink(tmp_path_.c_str());
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  LS_CHECK_MSG(!begun_, "SafetensorsWriter::set_metadata after begin()");
  metadata_[key] = value;
}

Status SafetensorsWriter::declare(const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  auto bad = [&](const std::string& msg) {
    return make_error(ErrorCode::invalid_argument, path_ + ": tensor " + quote_name(name) + ": " + msg);
  };
  if (begun_) return bad("declared after begin() (declare every tensor first)");
  if (name == "__metadata__") return bad("the name is reserved for the metadata");
  for (const Decl& d : decls_)
    if (d.name == name) return bad("declared twice");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return bad("negative dimension in shape " + shape_text(shape));
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
      return bad("shape " + shape_text(shape) + " is too large");
  }
  uint64_t bytes = 0, total = 0;
  if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(dtype)), &bytes) ||
      __builtin_add_overflow(data_bytes_, bytes, &total))
    return bad("shape " + shape_text(shape) + " is too large");
  data_bytes_ = total;
  decls_.push_back(Decl{name, dtype, shape, bytes});
  return {};
}

Status SafetensorsWriter::fail_io(const std::string& what, int err) {
  failed_ = make_error(ErrorCode::io, "cannot write " + path_ + ": " + what + " " + tmp_path_ + ": " +
                                          std::strerror(err) +
                                          (err == ENOSPC || err == EFBIG ? " (disk full or file size limit)" : ""));
  return failed_;
}

Status SafetensorsWriter::write_fully(const void* bytes, size_t n) {
  const char* p = static_cast<const char*>(bytes);
  while (n > 0) {
    ssize_t k = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (k < 0) {
      if (errno == EINTR) continue;
      return fail_io("writing", errno);
    }
    if (k == 0) return fail_io("writing", EIO);
    p += k;
    n -= static_cast<size_t>(k);
  }
  return {};
}

Status SafetensorsWriter::flush_buffer() {
  if (buffer_.empty()) return {};
  Status s = write_fully(buffer_.data(), buffer_.size());
  buffer_.clear();
  return s;
}

void SafetensorsWriter::skip_complete_tensors() {
  while (current_ < decls_.size() && written_in_current_ == decls_[current_].bytes) {
    ++current_;
    written_in_current_ = 0;
  }
}

Status SafetensorsWriter::begin() {
  if (!failed_.ok()) return failed_;
  if (begun_) return make_error(ErrorCode::invalid_argument, path_ + ": begin() called twice");

  // Header: metadata first, then tensors in declaration order (= data order), with
  // offsets back to back. ordered_json keeps that order in the text.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    header["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const Decl& d : decls_) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = dtype_safetensors_name(d.dtype);
    e["shape"] = d.shape;
    e["data_offsets"] = {offset, offset + d.bytes};
    header[d.name] = std::move(e);
    offset += d.bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::type_error& e) {
    return make_error(ErrorCode::invalid_argument,
                      path_ + ": a tensor name or metadata string is not valid UTF-8 (" + e.what() + ")");
  }
  // Pad with spaces to a multiple of 8 (as the reference writer does), so that the
  // data section starts 8-aligned in the file and in a page-aligned mapping.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > SafetensorsReader::kMaxHeaderBytes)
    return make_error(ErrorCode::invalid_argument, path_ + ": header of " + std::to_string(text.size()) +
                                                       " bytes exceeds the format's limit of " +
                                                       std::to_string(SafetensorsReader::kMaxHeaderBytes));

  // Where the bytes go: the output-file policy (io/output_file.h), resolved now.
  Expected<io::OutputTarget> target = io::check_output_path(path_, what_);
  if (!target.ok()) {
    failed_ = target.error();
    return failed_;
  }
  write_through_ = target->write_through;
  target_ = target->resolved;
  const uint64_t total = 8 + text.size() + data_bytes_;
  if (write_through_) {
    // A character device (/dev/null, a terminal): written in place. O_NONBLOCK only
    // for the open, so a node that turned into a FIFO since the check cannot block us;
    // fstat confirms what we opened.
    tmp_path_ = target_;
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
      int e = errno;
      failed_ = make_error(ErrorCode::io, "cannot open " + path_ + ": " + std::strerror(e));
      return failed_;
    }
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISCHR(st.st_mode)) {
      failed_ = make_error(ErrorCode::io, "cannot write " + path_ + ": it changed while being opened");
      return failed_;
    }
    int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) (void)::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  } else {
    // Beside the final target (a symlink's target), so the rename stays on one
    // filesystem and replaces the target, not the link.
    tmp_path_ = target_ + ".tmp-" + std::to_string(static_cast<long>(getpid()));
    // O_EXCL: never write into a file someone else is writing; a leftover from a
    // crashed process with the same pid is reported, not silently reused.
    fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0) {
      int e = errno;
      failed_ = make_error(ErrorCode::io, "cannot create " + tmp_path_ + " (temporary file for " + path_ +
                                              "): " + std::strerror(e) +
                                              (e == EEXIST ? " (a leftover from an interrupted run? remove it)" : ""));
      return failed_;
    }
    tmp_created_ = true;
  }
  begun_ = true;
  // Reserve the whole file now: a full disk fails here, before gigabytes are written.
  // Filesystems without fallocate just skip the reservation.
  if (!write_through_ && total > 0 && ::fallocate(fd_, 0, 0, static_cast<off_t>(total)) != 0) {
    int e = errno;
    if (e != EOPNOTSUPP && e != ENOSYS && e != EINVAL) return fail_io("reserving " + format_bytes(total) + " for", e);
  }
  buffer_.reserve(kWriteBufferBytes);
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));
  buffer_.insert(buffer_.end(), len, len + 8);
  buffer_.insert(buffer_.end(), text.begin(), text.end());
  current_ = 0;
  written_in_current_ = 0;
  skip_complete_tensors();  // leading zero-size tensors
  return {};
}

Status SafetensorsWriter::write(const void* bytes, size_t n) {
  if (!failed_.ok()) return failed_;
  if (!begun_) return make_error(ErrorCode::invalid_argument, path_ + ": write() before begin()");
  if (committed_) return make_error(ErrorCode::invalid_argument, path_ + ": write() after commit()");
  if (n == 0) return {};
  LS_CHECK_MSG(bytes != nullptr, "SafetensorsWriter::write of " + std::to_string(n) + " bytes from nullptr");
  if (current_ >= decls_.size())
    return make_error(ErrorCode::invalid_argument, path_ + ": writing " + std::to_string(n) +
                                                       " bytes past the declared size (" +
                                                       std::to_string(data_bytes_) + " bytes, all written)");
  const Decl& d = decls_[current_];
  if (n > d.bytes - written_in_current_)
    return make_error(ErrorCode::invalid_argument,
                      path_ + ": tensor " + quote_name(d.name) + ": a write of " + std::to_string(n) +
                          " bytes goes past its end (" + std::to_string(written_in_current_) + " of " +
                          std::to_string(d.bytes) + " bytes written so far): wrong byte count for this tensor");
  if (buffer_.size() + n > kWriteBufferBytes) LS_TRY(flush_buffer());
  if (n >= kWriteBufferBytes) {
    LS_TRY(write_fully(bytes, n));
  } else {
    const char* p = static_cast<const char*>(bytes);
    buffer_.insert(buffer_.end(), p, p + n);
  }
  written_in_current_ += n;
  data_written_ += n;
  skip_complete_tensors();
  return {};
}

Status SafetensorsWriter::write_tensor(const std::string& name, const void* bytes, size_t n) {
  if (!failed_.ok()) return failed_;
  if (!begun_) return make_error(ErrorCode::invalid_argument, path_ + ": write_tensor() before begin()");
  auto it = std::find_if(decls_.begin(), decls_.end(), [&](const Decl& d) { return d.name == name; });
  if (it == decls_.end())
    return make_error(ErrorCode::invalid_argument, path_ + ": tensor " + quote_name(name) + " was not declared");
  if (it->bytes == 0 && n == 0) return {};  // zero-size tensors need no write
  if (current_ >= decls_.size() || decls_[current_].name != name || written_in_current_ != 0) {
    std::string expected = current_ < decls_.size() ? "tensor " + quote_name(decls_[current_].name) : "nothing (all written)";
    return make_error(ErrorCode::invalid_argument, path_ + ": tensor " + quote_name(name) +
                                                       " written out of declaration order; next expected: " + expected);
  }
  if (n != it->bytes)
    return make_error(ErrorCode::invalid_argument,
                      path_ + ": tensor " + quote_name(name) + ": wrong byte count: got " + std::to_string(n) + ", " +
                          dtype_safetensors_name(it->dtype) + " " + shape_text(it->shape) + " needs " +
                          std::to_string(it->bytes));
  return write(bytes, n);
}

Status SafetensorsWriter::commit() {
  if (!failed_.ok()) return failed_;
  if (!begun_) return make_error(ErrorCode::invalid_argument, path_ + ": commit() before begin()");
  if (committed_) return make_error(ErrorCode::invalid_argument, path_ + ": commit() called twice");
  if (current_ < decls_.size()) {
    const Decl& d = decls_[current_];
    return make_error(ErrorCode::invalid_argument,
                      path_ + ": commit() with tensors incomplete: tensor " + quote_name(d.name) + " has " +
                          std::to_string(written_in_current_) + " of " + std::to_string(d.bytes) +
                          " bytes written (" + std::to_string(decls_.size() - current_) + " tensor(s) unfinished)");
  }
  LS_TRY(flush_buffer());
  if (write_through_) {
    // A device: nothing to sync or rename.
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return fail_io("closing", errno);
    committed_ = true;
    return {};
  }
  // Durable before visible: the data reaches the disk, then the rename publishes it,
  // so the target is always either the old file or the complete new one.
  if (::fsync(fd_) != 0) return fail_io("syncing", errno);
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return fail_io("closing", errno);
  if (::rename(tmp_path_.c_str(), target_.c_str()) != 0) {
    int e = errno;
    failed_ = make_error(ErrorCode::io, "cannot rename " + tmp_path_ + " to " + target_ + ": " + std::strerror(e));
    return failed_;
  }
  committed_ = true;
  // Make the rename itself durable (best effort: the file is complete either way).
  std::string dir = ".";
  if (auto slash = target_.find_last_of('/'); slash != std::string::npos)
    dir = slash == 0 ? "/" : target_.substr(0, slash);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return {};
}

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<const NamedTensor*> order;
  for (const NamedTensor& t : tensors) {
    if (t.view.device.kind != DeviceKind::cpu)
      return make_error(ErrorCode::invalid_argument, path + ": tensor " + quote_name(t.name) + " is on " +
                                                         t.view.device.str() + ", not on the host");
    if (!t.view.is_contiguous())
      return make_error(ErrorCode::invalid_argument,
                        path + ": tensor " + quote_name(t.name) + " (" + t.view.shape_str() + ") is not contiguous");
    if (t.view.numel() > 0 && t.view.data == nullptr)
      return make_error(ErrorCode::invalid_argument, path + ": tensor " + quote_name(t.name) + " has no data");
    order.push_back(&t);
  }
  // Larger elements first: every tensor then starts at a multiple of its element size.
  std::stable_sort(order.begin(), order.end(), [](const NamedTensor* a, const NamedTensor* b) {
    return dtype_size(a->view.dtype) > dtype_size(b->view.dtype);
  });
  SafetensorsWriter w(path);
  for (const auto& [k, v] : metadata) w.set_metadata(k, v);
  for (const NamedTensor* t : order)
    LS_TRY(w.declare(t->name, t->view.dtype,
                     std::vector<int64_t>(t->view.shape.begin(), t->view.shape.begin() + t->view.ndim)));
  LS_TRY(w.begin());
  for (const NamedTensor* t : order)
    LS_TRY(w.write_tensor(t->name, t->view.data, static_cast<size_t>(t->view.nbytes())));
  return w.commit();
}

}  // namespace ls
