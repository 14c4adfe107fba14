// safetensors reader and writer: round trips of every dtype, a corpus of malformed
// files (each rejected with its own message), mutation of valid files (never a
// crash), and the writer's atomicity (an interrupted writer leaves nothing behind and
// does not clobber an existing file). Runs under ASan + UBSan in CI (label sanitize).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "file_test_util.h"
#include "io/safetensors.h"

namespace ls {
namespace {

using ls::test::read_all;
using ls::test::write_all;
namespace fs = std::filesystem;

// Each test in a fresh temporary folder.
struct SafetensorsTest : test::TempDirTest {
  SafetensorsTest() : TempDirTest("ls_safetensors") {}
};

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

// A safetensors file from a raw header text and a data section.
std::string raw_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// Deterministic bytes with no zero byte (so a "round trip" of zeros cannot pass by
// accident); float bit patterns need not be valid numbers for a byte round trip.
std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(1 + rng() % 255);
  return v;
}

// ---------------------------------------------------------------------------------
// Round trips

TEST_F(SafetensorsTest, RoundTripEveryDtypeAndShapeWithMetadata) {
  const std::vector<DType> dtypes = {DType::f64, DType::f32, DType::bf16, DType::f16,
                                     DType::f8e4m3, DType::i8, DType::i32, DType::u8};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {7}, {3, 5}, {2, 0, 4}, {2, 3, 1, 5}};
  struct Owned { std::string name; DType dtype; std::vector<int64_t> shape; std::vector<uint8_t> bytes; };
  std::vector<Owned> owned;
  uint32_t seed = 1;
  for (DType t : dtypes) {
    for (const auto& shape : shapes) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      owned.push_back({std::string(dtype_name(t)) + "/" + std::to_string(owned.size()), t, shape,
                       pattern_bytes(static_cast<size_t>(n * dtype_size(t)), seed++)});
    }
  }
  // Interleave dtypes so write_safetensors has to reorder for alignment.
  std::shuffle(owned.begin(), owned.end(), std::mt19937(7));
  std::vector<NamedTensor> tensors;
  for (auto& o : owned)
    tensors.push_back({o.name, TensorView::contiguous(o.bytes.data(), o.dtype, o.shape.data(),
                                                      static_cast<int>(o.shape.size()))});
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "multi\nline \"quoted\" é"}, {"", ""}};
  const std::string path = file("all.safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors, meta).ok());

  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const SafetensorsReader& rd = **r;
  EXPECT_EQ(rd.metadata(), meta);
  ASSERT_EQ(rd.entries().size(), owned.size());
  EXPECT_TRUE(rd.unsupported_tensors().empty());
  // The header is padded to a multiple of 8 with spaces; data follows with no gap.
  EXPECT_EQ(rd.data_start() % 8, 0u);
  uint64_t expect_begin = 0;
  for (const SafetensorsEntry& e : rd.entries()) {  // sorted by offset
    EXPECT_EQ(e.begin, expect_begin) << e.name;
    expect_begin = e.end;
  }
  EXPECT_EQ(rd.data_start() + expect_begin, rd.file_size());
  size_t nonempty = 0;
  for (const Owned& o : owned) {
    const SafetensorsEntry* e = rd.find(o.name);
    ASSERT_NE(e, nullptr) << o.name;
    EXPECT_EQ(e->dtype, o.dtype) << o.name;
    EXPECT_EQ(e->shape, o.shape) << o.name;
    EXPECT_EQ(e->end - e->begin, o.bytes.size()) << o.name;
    EXPECT_TRUE(rd.is_aligned(*e)) << o.name;
    if (!o.bytes.empty()) {
      ++nonempty;
      EXPECT_EQ(std::memcmp(rd.data(*e), o.bytes.data(), o.bytes.size()), 0) << o.name;
    }
    auto v = rd.try_view(*e);
    ASSERT_TRUE(v.ok()) << v.error().message;
    if (o.shape.empty()) {
      EXPECT_EQ(v->ndim, 1);  // scalars become [1]
      EXPECT_EQ(v->shape[0], 1);
    } else {
      ASSERT_EQ(v->ndim, static_cast<int>(o.shape.size()));
      for (size_t i = 0; i < o.shape.size(); ++i) EXPECT_EQ(v->shape[i], o.shape[i]);
    }
    EXPECT_TRUE(v->is_contiguous());
    EXPECT_EQ(v->dtype, o.dtype);
    EXPECT_EQ(v->data, rd.data(*e));
  }
  EXPECT_GT(nonempty, 30u);  // the comparison above was not vacuous
  EXPECT_EQ(rd.find("absent"), nullptr);
}

TEST_F(SafetensorsTest, FloatValuesSurviveRoundTrip) {
  // Values, not just bytes: f32 data read back through the view equals what was stored.
  std::vector<float> x = {1.5f, -2.25f, 3.0e-39f, 65504.0f, -0.0f, 1e30f};
  const std::string path = file("values.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"x", TensorView(x.data(), DType::f32, {2, 3})}}).ok());
  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  TensorView v = (*r)->view(*(*r)->find("x"));
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(f32_bits(load_as_f32(v.data, v.dtype, i)), f32_bits(x[static_cast<size_t>(i)]));
}

TEST_F(SafetensorsTest, HeaderMatchesReferenceLayoutByteForByte) {
  // The layout the reference writer produces for this content: compact JSON with the
  // metadata first, fields in the order dtype, shape, data_offsets, padded with spaces
  // to a multiple of 8.
  std::vector<float> a = {1.0f, 2.0f};
  std::vector<uint16_t> b = {0x3f80, 0x4000, 0x4040};
  const std::string path = file("ref.safetensors");
  SafetensorsWriter w(path);
  w.set_metadata("format", "pt");
  ASSERT_TRUE(w.declare("a", DType::f32, {2}).ok());
  ASSERT_TRUE(w.declare("b", DType::bf16, {3}).ok());
  ASSERT_TRUE(w.begin().ok());
  ASSERT_TRUE(w.write_tensor("a", a.data(), 8).ok());
  ASSERT_TRUE(w.write_tensor("b", b.data(), 6).ok());
  ASSERT_TRUE(w.commit().ok());
  std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}})";
  const size_t pad = (8 - json.size() % 8) % 8;
  ASSERT_GT(pad, 0u);  // the case exercises padding
  json.append(pad, ' ');
  std::string expected = le64(json.size()) + json;
  expected.append(reinterpret_cast<const char*>(a.data()), 8);
  expected.append(reinterpret_cast<const char*>(b.data()), 6);
  EXPECT_EQ(read_all(path), expected);
}

TEST_F(SafetensorsTest, MoreThanFourDimsListedButNotViewable) {
  std::vector<uint8_t> bytes = pattern_bytes(2 * 1 * 3 * 1 * 2, 3);
  const std::string path = file("5d.safetensors");
  SafetensorsWriter w(path);
  ASSERT_TRUE(w.declare("five", DType::u8, {2, 1, 3, 1, 2}).ok());
  ASSERT_TRUE(w.begin().ok());
  ASSERT_TRUE(w.write(bytes.data(), bytes.size()).ok());
  ASSERT_TRUE(w.commit().ok());
  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const SafetensorsEntry* e = (*r)->find("five");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->shape.size(), 5u);
  EXPECT_EQ(std::memcmp((*r)->data(*e), bytes.data(), bytes.size()), 0);
  auto v = (*r)->try_view(*e);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("'five' has 5 dims"), std::string::npos) << v.error().message;
  EXPECT_DEATH((void)(*r)->view(*e), "at most 4");
}

TEST_F(SafetensorsTest, MisalignedTensorIsReadableButTryViewRefuses) {
  // A foreign writer may put an f32 at an odd offset: listed and readable by copy.
  const std::string hdr = R"({"p":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                          R"("x":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  std::string h = hdr;
  h.append((8 - h.size() % 8) % 8, ' ');
  const float one = 1.0f;
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(&one), 4);
  const std::string path = file("misaligned.safetensors");
  write_all(path, raw_file(h, data));
  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const SafetensorsEntry* e = (*r)->find("x");
  ASSERT_NE(e, nullptr);
  EXPECT_FALSE((*r)->is_aligned(*e));
  float got = 0;
  std::memcpy(&got, (*r)->data(*e), 4);
  EXPECT_EQ(got, 1.0f);
  auto v = (*r)->try_view(*e);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("not a multiple of its element size"), std::string::npos);
}

TEST_F(SafetensorsTest, UnsupportedButValidDtypeIsListedSeparately) {
  const std::string h = R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
                        R"("w":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
  const std::string path = file("i64.safetensors");
  write_all(path, raw_file(h, std::string(20, '\x01')));
  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ((*r)->entries().size(), 1u);
  EXPECT_EQ((*r)->entries()[0].name, "w");
  ASSERT_EQ((*r)->unsupported_tensors().size(), 1u);
  EXPECT_EQ((*r)->unsupported_tensors()[0], "ids (I64 [2])");
  EXPECT_EQ((*r)->find("ids"), nullptr);
}

TEST_F(SafetensorsTest, EdgeCasesThatAreValid) {
  // Zero-size tensors at the start, between and after the others, an empty header
  // object, an element count that would overflow but for a zero dim, tensors listed in
  // another order than their bytes, whitespace around the JSON.
  struct Case { std::string header, data; size_t entries; };
  const std::vector<Case> cases = {
      {"{}", "", 0},
      {"  {\"__metadata__\":{}}  ", "", 0},
      {R"({"z":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("y":{"dtype":"U8","shape":[0,3],"data_offsets":[0,0]},"m":{"dtype":"U8","shape":[0],"data_offsets":[8,8]}})",
       std::string(8, 'x'), 4},
      {R"({"z":{"dtype":"F32","shape":[0,4611686018427387904,4611686018427387904],"data_offsets":[0,0]}})", "", 1},
      {R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
       std::string(6, 'x'), 2},
      {R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})", std::string(8, 'x'), 1},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = file("valid" + std::to_string(i) + ".safetensors");
    write_all(path, raw_file(cases[i].header, cases[i].data));
    auto r = SafetensorsReader::open(path);
    ASSERT_TRUE(r.ok()) << "case " << i << ": " << r.error().message;
    EXPECT_EQ((*r)->entries().size(), cases[i].entries) << "case " << i;
  }
}

// ---------------------------------------------------------------------------------
// Malformed files: each is rejected, with its own message.

struct BadFile {
  const char* what;
  std::string bytes;
  const char* expect;  // distinctive substring of the message
};

std::string entry_file(const std::string& entry_json, const std::string& data = std::string(16, 'd')) {
  return raw_file("{\"t\":" + entry_json + "}", data);
}

// A valid one-tensor file whose header length is one byte short: it stops inside the
// header's space padding, so the data section starts with a space and every tensor is
// read one byte early (issue 11: all-NaN output, exit 0, before the coverage check).
std::string header_length_into_padding() {
  std::string h = R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  h.append((8 - h.size() % 8) % 8, ' ');
  if (h.back() != ' ') h.append(8, ' ');
  return le64(h.size() - 1) + h + "dddd";
}

std::vector<BadFile> malformed_corpus() {
  std::string deep = std::string(100, '[') + std::string(100, ']');
  return {
      {"shorter than 8 bytes", std::string("\x05\x00\x00", 3), "shorter than the 8-byte header length"},
      {"header length past the end", le64(1000) + "{}" + std::string(90, ' '), "is larger than the 92 bytes"},
      {"header length over the limit", le64(1ull << 40) + "{}", "exceeds the limit of 100000000 bytes"},
      {"JSON syntax error", raw_file("{\"t\": ", ""), "unexpected end of input"},
      {"invalid UTF-8", raw_file("{\"\xff\":1}", ""), "ill-formed UTF-8"},
      {"header not an object", raw_file("[1, 2]", ""), "header is not a JSON object (it is a array)"},
      {"nesting too deep", raw_file("{\"__metadata__\":" + deep + "}", ""), "nests deeper than 64 levels"},
      {"duplicate tensor name",
       raw_file(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                "ab"),
       "'t': listed twice"},
      {"duplicate key in an entry", entry_file(R"({"dtype":"U8","dtype":"F32","shape":[1],"data_offsets":[0,1]})"),
       "key 'dtype' appears twice"},
      {"metadata not an object", raw_file(R"({"__metadata__":[1]})", ""), "__metadata__ is not an object of strings (it is a array)"},
      {"metadata value not a string", raw_file(R"({"__metadata__":{"k":3}})", ""), "key 'k' holds a number"},
      {"entry not an object", entry_file("5"), "entry is not a JSON object (it is a number)"},
      {"dtype missing", entry_file(R"({"shape":[1],"data_offsets":[0,1]})"), "'t': missing \"dtype\""},
      {"dtype not a string", entry_file(R"({"dtype":7,"shape":[1],"data_offsets":[0,1]})"), "\"dtype\" is not a string"},
      {"dtype unknown", entry_file(R"({"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]})"), "unknown dtype 'Q4_K'"},
      {"shape missing", entry_file(R"({"dtype":"U8","data_offsets":[0,1]})"), "missing \"shape\""},
      {"shape not an array", entry_file(R"({"dtype":"U8","shape":3,"data_offsets":[0,1]})"), "\"shape\" is not an array"},
      {"shape dim negative", entry_file(R"({"dtype":"U8","shape":[1,-3],"data_offsets":[0,1]})"), "shape[1] is negative (-3)"},
      {"shape dim not an integer", entry_file(R"({"dtype":"U8","shape":[1.5],"data_offsets":[0,1]})"), "shape[0] is not an integer"},
      {"shape dim not a number", entry_file(R"({"dtype":"U8","shape":["2"],"data_offsets":[0,1]})"), "shape[0] is not a number"},
      {"shape dim beyond int64", entry_file(R"({"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,1]})"),
       "does not fit in int64"},
      {"element count overflows int64",
       entry_file(R"({"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]})"), "more elements than int64 can count"},
      {"byte count overflows uint64", entry_file(R"({"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,1]})"),
       "overflows 64 bits"},
      {"data_offsets missing", entry_file(R"({"dtype":"U8","shape":[1]})"), "missing \"data_offsets\""},
      {"data_offsets not two numbers", entry_file(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1,2]})"),
       "\"data_offsets\" is not an array of two integers"},
      {"data_offsets negative", entry_file(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})"), "data_offsets[0] is negative"},
      {"data_offsets not integers", entry_file(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1.0]})"),
       "data_offsets[1] is not an integer"},
      {"data_offsets descending", entry_file(R"({"dtype":"U8","shape":[0],"data_offsets":[8,0]})"), "are not ascending"},
      {"byte range length wrong", entry_file(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})"),
       "span 4 bytes but F32 [2] needs 8 bytes"},
      {"byte range outside the data", entry_file(R"({"dtype":"F32","shape":[8],"data_offsets":[0,32]})"),
       "reach past the end of the data section (16 bytes"},
      {"byte ranges overlap",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                std::string(12, 'd')),
       "overlap those of tensor 'a'"},
      // Unindexed bytes: the data section must be covered exactly by the tensors.
      {"empty tensor inside another's bytes",
       raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"z":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                std::string(8, 'd')),
       "lies inside the bytes [0, 8) of tensor 'a'"},
      {"gap between tensors",
       raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                std::string(12, 'd')),
       "'b': bytes [8, 12) start 4 bytes after tensor 'a' ends: bytes [4, 8) of the data section belong to no tensor"},
      {"gap before the first tensor", entry_file(R"({"dtype":"U8","shape":[4],"data_offsets":[2,6]})", std::string(6, 'd')),
       "start 2 bytes after the start of the data section"},
      {"trailing bytes", entry_file(R"({"dtype":"U8","shape":[4],"data_offsets":[0,4]})", std::string(7, 'd')),
       "3 trailing bytes [4, 7) of the data section follow the last tensor 't' (which ends at 4)"},
      {"trailing bytes and no tensor", raw_file("{}", "12345"), "follow a header that gives no tensor any bytes"},
      {"header length into the padding", header_length_into_padding(),
       "seems to stop inside the header's padding, which shifts every tensor by 1 byte(s)"},
  };
}

TEST_F(SafetensorsTest, MalformedFilesEachRejectedWithOwnMessage) {
  const std::vector<BadFile> corpus = malformed_corpus();
  std::vector<std::string> messages;
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string path = file("bad" + std::to_string(i) + ".safetensors");
    write_all(path, corpus[i].bytes);
    auto r = SafetensorsReader::open(path);
    ASSERT_FALSE(r.ok()) << corpus[i].what << " was accepted";
    const std::string& msg = r.error().message;
    EXPECT_NE(msg.find(corpus[i].expect), std::string::npos) << corpus[i].what << ": message was: " << msg;
    EXPECT_EQ(msg.rfind(path, 0), 0u) << corpus[i].what << ": message does not start with the path: " << msg;
    EXPECT_TRUE(r.error().code == ErrorCode::invalid_file) << corpus[i].what;
    messages.push_back(msg);
    // The in-memory entry point (the fuzz target's) says the same, under its name.
    auto m = SafetensorsReader::from_bytes(corpus[i].bytes.data(), corpus[i].bytes.size(), path);
    ASSERT_FALSE(m.ok()) << corpus[i].what << " was accepted from memory";
    EXPECT_EQ(m.error().message, msg) << corpus[i].what;
  }
  // Each message is its own: no case's distinctive text appears in another's message.
  for (size_t i = 0; i < corpus.size(); ++i)
    for (size_t j = 0; j < corpus.size(); ++j)
      if (i != j) {
        EXPECT_EQ(messages[i].find(corpus[j].expect), std::string::npos)
            << corpus[i].what << " says what " << corpus[j].what << " says: " << messages[i];
      }
}

TEST_F(SafetensorsTest, MessagesHoldOnlyPrintableAscii) {
  // nlohmann's parse error quotes the bytes it stopped at; a raw 0x85 (or an escape
  // sequence) must not reach a terminal or a log. Found by fuzz/fuzz_safetensors.
  const std::vector<std::string> headers = {
      "{\"t\":{\"dtype\":\"F64\",\"shape\":[46116\x85],\"data_offsets\":[0,8]}}",
      "{\"t\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":\"\xc3\xa9\x1b[31m\"}}",
      "{\"t\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[\"\u00e9\", 1]}}",
  };
  for (const std::string& h : headers) {
    const std::string bytes = raw_file(h, std::string(8, 'd'));
    auto r = SafetensorsReader::from_bytes(bytes.data(), bytes.size(), "m");
    ASSERT_FALSE(r.ok()) << h;
    for (unsigned char c : r.error().message)
      EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "byte " << int(c) << " in: " << r.error().message;
  }
  const std::string first = raw_file(headers[0], "");
  auto r = SafetensorsReader::from_bytes(first.data(), first.size(), "m");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("46116\\x85"), std::string::npos) << r.error().message;
}

TEST_F(SafetensorsTest, MissingFileAndDirectory) {
  auto r = SafetensorsReader::open(file("nope.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.error().code == ErrorCode::not_found);
  EXPECT_NE(r.error().message.find("No such file"), std::string::npos) << r.error().message;
  auto d = SafetensorsReader::open(dir_.string());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().message.find(dir_.string() + ": is a directory, not a regular file"), std::string::npos)
      << d.error().message;
  EXPECT_TRUE(d.error().code == ErrorCode::invalid_file);
}

TEST_F(SafetensorsTest, FifoAndDeviceAreRefusedWithoutBlocking) {
  // A FIFO given as the model used to block open() forever (waiting for a writer). If it
  // still did, the alarm would kill this test binary: a failure, not a hung CI job.
  const std::string fifo = file("model.safetensors");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0666), 0);
  alarm(30);
  auto r = SafetensorsReader::open(fifo);
  alarm(0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(fifo + ": is a FIFO (named pipe), not a regular file"), std::string::npos)
      << r.error().message;
  // A character device (never opened: refused on its stat).
  auto n = SafetensorsReader::open("/dev/null");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message.find("/dev/null: is a character device, not a regular file"), std::string::npos)
      << n.error().message;
  // A symbolic link to a valid file is fine (it is the file that must be regular).
  std::vector<uint8_t> a = pattern_bytes(4, 1);
  ASSERT_TRUE(write_safetensors(file("real.safetensors"), {{"a", TensorView(a.data(), DType::u8, {4})}}).ok());
  fs::create_symlink("real.safetensors", file("link.safetensors"));
  auto l = SafetensorsReader::open(file("link.safetensors"));
  ASSERT_TRUE(l.ok()) << l.error().message;
}

TEST_F(SafetensorsTest, FromBytesMatchesOpen) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f};
  const std::string path = file("m.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"a", TensorView(a.data(), DType::f32, {3})}}, {{"k", "v"}}).ok());
  const std::string bytes = read_all(path);
  auto r = SafetensorsReader::from_bytes(bytes.data(), bytes.size(), "mem");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->path(), "mem");
  EXPECT_EQ((*r)->metadata().at("k"), "v");
  ASSERT_EQ((*r)->entries().size(), 1u);
  EXPECT_EQ(std::memcmp((*r)->data((*r)->entries()[0]), a.data(), 12), 0);
  EXPECT_TRUE((*r)->is_aligned((*r)->entries()[0]));
  auto e = SafetensorsReader::from_bytes(nullptr, 0);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("<memory>: file is 0 bytes"), std::string::npos) << e.error().message;
}

TEST_F(SafetensorsTest, CommittedFilesAreCoveredExactly) {
  // Every safetensors file in the tree (golden files written by the Python reference
  // and by our writer) passes the exact-coverage check.
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(LS_TEST_DATA_DIR)) {
    if (e.path().extension() != ".safetensors") continue;
    auto r = SafetensorsReader::open(e.path().string());
    EXPECT_TRUE(r.ok()) << r.error().message;
    ++n;
  }
  EXPECT_GE(n, 9u);
}

TEST_F(SafetensorsTest, TruncatedAndMutatedFilesNeverCrash) {
  // Every truncation and a few thousand random byte mutations of a valid file: open()
  // returns a value (ok or an error) every time; under ASan this also proves no
  // out-of-bounds read. Successful opens are read in full.
  std::vector<float> a(6, 1.0f);
  std::vector<uint16_t> b(5, 0x3f80);
  const std::string path = file("good.safetensors");
  ASSERT_TRUE(write_safetensors(path, {{"alpha", TensorView(a.data(), DType::f32, {2, 3})},
                                       {"beta", TensorView(b.data(), DType::bf16, {5})}},
                                {{"k", "v"}}).ok());
  const std::string good = read_all(path);
  const std::string mutated = file("mutated.safetensors");
  size_t accepted = 0, rejected = 0;
  auto probe = [&](const std::string& bytes) {
    // A new file each time: rewriting a truncated file makes ext4 flush it on close.
    fs::remove(mutated);
    write_all(mutated, bytes);
    auto r = SafetensorsReader::open(mutated);
    if (!r.ok()) {
      ++rejected;
      EXPECT_FALSE(r.error().message.empty());
      return;
    }
    ++accepted;
    uint64_t sum = 0;
    for (const auto& e : (*r)->entries()) {
      const auto* p = static_cast<const unsigned char*>((*r)->data(e));
      for (uint64_t i = 0; i < e.end - e.begin; ++i) sum += p[i];
    }
    (void)sum;
  };
  for (size_t n = 0; n < good.size(); ++n) probe(good.substr(0, n));
  std::mt19937 rng(42);
  const std::string printable = "{}[]\",:0123456789-.eE ";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = good;
    int edits = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < edits; ++k) {
      size_t pos = rng() % m.size();
      m[pos] = (rng() % 2) ? static_cast<char>(rng()) : printable[rng() % printable.size()];
    }
    probe(m);
  }
  EXPECT_GT(rejected, 1000u);
  EXPECT_GT(accepted, 0u);  // mutations in the data section are still valid files
}

// ---------------------------------------------------------------------------------
// Writer

TEST_F(SafetensorsTest, PiecewiseWriteEqualsWholeWrite) {
  std::vector<uint8_t> a = pattern_bytes(4 * 1000, 10);  // f32 [10, 100]
  std::vector<uint8_t> b = pattern_bytes(2 * 333, 11);   // bf16 [333]
  std::vector<uint8_t> c = pattern_bytes(7, 12);         // u8 [7]
  auto declare_all = [&](SafetensorsWriter& w) {
    w.set_metadata("k", "v");
    ASSERT_TRUE(w.declare("a", DType::f32, {10, 100}).ok());
    ASSERT_TRUE(w.declare("empty", DType::f16, {0, 3}).ok());
    ASSERT_TRUE(w.declare("b", DType::bf16, {333}).ok());
    ASSERT_TRUE(w.declare("c", DType::u8, {7}).ok());
    ASSERT_TRUE(w.begin().ok());
  };
  const std::string whole = file("whole.safetensors"), pieces = file("pieces.safetensors");
  {
    SafetensorsWriter w(whole);
    declare_all(w);
    ASSERT_TRUE(w.write_tensor("a", a.data(), a.size()).ok());
    ASSERT_TRUE(w.write_tensor("empty", nullptr, 0).ok());
    ASSERT_TRUE(w.write_tensor("b", b.data(), b.size()).ok());
    ASSERT_TRUE(w.write_tensor("c", c.data(), c.size()).ok());
    ASSERT_TRUE(w.commit().ok());
  }
  {
    SafetensorsWriter w(pieces);
    declare_all(w);
    std::mt19937 rng(5);
    for (const auto* t : {&a, &b, &c}) {
      size_t off = 0;
      while (off < t->size()) {
        size_t n = std::min<size_t>(t->size() - off, 1 + rng() % 97);
        ASSERT_TRUE(w.write(t->data() + off, n).ok());
        ASSERT_TRUE(w.write(nullptr, 0).ok());  // empty pieces are fine
        off += n;
      }
    }
    ASSERT_TRUE(w.commit().ok());
  }
  const std::string wb = read_all(whole);
  EXPECT_GT(wb.size(), a.size() + b.size() + c.size());
  EXPECT_EQ(wb, read_all(pieces));
  // And through write_safetensors (the order a, b, c is already by element size).
  const std::string conv = file("conv.safetensors");
  ASSERT_TRUE(write_safetensors(conv,
                                {{"a", TensorView(a.data(), DType::f32, {10, 100})},
                                 {"empty", TensorView(nullptr, DType::f16, {0, 3})},
                                 {"b", TensorView(b.data(), DType::bf16, {333})},
                                 {"c", TensorView(c.data(), DType::u8, {7})}},
                                {{"k", "v"}})
                  .ok());
  EXPECT_EQ(wb, read_all(conv));
  EXPECT_EQ(listing(), (std::vector<std::string>{"conv.safetensors", "pieces.safetensors", "whole.safetensors"}));
}

TEST_F(SafetensorsTest, LargeWritesBypassTheBuffer) {
  // Pieces larger than the writer's 4 MiB buffer, mixed with small ones.
  std::vector<uint8_t> big = pattern_bytes(9u << 20, 20);
  const std::string p1 = file("big1.safetensors"), p2 = file("big2.safetensors");
  for (const auto& path : {p1, p2}) {
    SafetensorsWriter w(path);
    ASSERT_TRUE(w.declare("big", DType::u8, {static_cast<int64_t>(big.size())}).ok());
    ASSERT_TRUE(w.begin().ok());
    if (path == p1) {
      ASSERT_TRUE(w.write(big.data(), 3).ok());
      ASSERT_TRUE(w.write(big.data() + 3, (5u << 20)).ok());
      ASSERT_TRUE(w.write(big.data() + 3 + (5u << 20), big.size() - 3 - (5u << 20)).ok());
    } else {
      ASSERT_TRUE(w.write(big.data(), big.size()).ok());
    }
    ASSERT_TRUE(w.commit().ok());
  }
  EXPECT_EQ(read_all(p1), read_all(p2));
  auto r = SafetensorsReader::open(p1);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(std::memcmp((*r)->data((*r)->entries()[0]), big.data(), big.size()), 0);
}

TEST_F(SafetensorsTest, InterruptedWriterLeavesNoFileAndKeepsExisting) {
  std::vector<uint8_t> a = pattern_bytes(64, 30);
  const std::string fresh = file("fresh.safetensors");
  const std::string existing = file("existing.safetensors");
  write_all(existing, "previous content");
  for (const auto& path : {fresh, existing}) {
    SafetensorsWriter w(path);
    ASSERT_TRUE(w.declare("a", DType::u8, {64}).ok());
    ASSERT_TRUE(w.declare("b", DType::u8, {64}).ok());
    ASSERT_TRUE(w.begin().ok());
    ASSERT_TRUE(w.write_tensor("a", a.data(), a.size()).ok());
    ASSERT_TRUE(w.write(a.data(), 10).ok());
    // While writing, the temporary file exists beside the target.
    EXPECT_TRUE(fs::exists(path + ".tmp-" + std::to_string(getpid())));
  }  // destroyed without commit()
  EXPECT_FALSE(fs::exists(fresh));
  EXPECT_EQ(read_all(existing), "previous content");
  EXPECT_EQ(listing(), std::vector<std::string>{"existing.safetensors"});
  // A writer of one tensor "a" of 64 bytes over `existing`, n of them written: commit()'s answer.
  const auto commit_a = [&](size_t n) {
    SafetensorsWriter w(existing);
    EXPECT_TRUE(w.declare("a", DType::u8, {64}).ok());
    EXPECT_TRUE(w.begin().ok());
    EXPECT_TRUE(w.write(a.data(), n).ok());
    return w.commit();
  };
  // A failed commit (tensors incomplete) is the same: nothing published.
  const Status s = commit_a(63);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("commit() with tensors incomplete: tensor 'a' has 63 of 64 bytes"), std::string::npos)
      << s.message();
  EXPECT_EQ(read_all(existing), "previous content");
  EXPECT_EQ(listing(), std::vector<std::string>{"existing.safetensors"});
  // And a committed writer replaces the file.
  ASSERT_TRUE(commit_a(64).ok());
  auto r = SafetensorsReader::open(existing);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(std::memcmp((*r)->data(*(*r)->find("a")), a.data(), 64), 0);
  EXPECT_EQ(listing(), std::vector<std::string>{"existing.safetensors"});
}

TEST_F(SafetensorsTest, WriterErrorsAreStatusesWithMessages) {
  std::vector<uint8_t> a = pattern_bytes(64, 40);
  auto has = [](const Status& s, const std::string& text) {
    return !s.ok() && s.message().find(text) != std::string::npos;
  };
  {
    SafetensorsWriter w(file("no/such/dir/x.safetensors"));
    ASSERT_TRUE(w.declare("a", DType::u8, {4}).ok());
    Status s = w.begin();
    EXPECT_TRUE(has(s, "cannot write")) << s.message();
    EXPECT_TRUE(has(s, "no/such/dir does not exist")) << s.message();
    EXPECT_TRUE(has(w.write(a.data(), 4), "does not exist"));  // the failure sticks
  }
  const std::string path = file("x.safetensors");
  {
    SafetensorsWriter w(path);
    ASSERT_TRUE(w.declare("a", DType::f32, {4}).ok());
    EXPECT_TRUE(has(w.declare("a", DType::f32, {4}), "'a': declared twice"));
    EXPECT_TRUE(has(w.declare("__metadata__", DType::f32, {4}), "reserved"));
    EXPECT_TRUE(has(w.declare("neg", DType::f32, {2, -1}), "negative dimension"));
    EXPECT_TRUE(has(w.declare("huge", DType::f64, {1ll << 62, 4}), "too large"));
    EXPECT_TRUE(has(w.write(a.data(), 4), "write() before begin()"));
    EXPECT_TRUE(has(w.commit(), "commit() before begin()"));
    ASSERT_TRUE(w.declare("b", DType::u8, {3}).ok());
    ASSERT_TRUE(w.begin().ok());
    EXPECT_TRUE(has(w.begin(), "begin() called twice"));
    EXPECT_TRUE(has(w.declare("c", DType::u8, {1}), "declared after begin()"));
    EXPECT_TRUE(has(w.write_tensor("a", a.data(), 15), "wrong byte count: got 15, F32 [4] needs 16"));
    EXPECT_TRUE(has(w.write_tensor("b", a.data(), 3), "out of declaration order; next expected: tensor 'a'"));
    EXPECT_TRUE(has(w.write_tensor("zz", a.data(), 3), "'zz' was not declared"));
    ASSERT_TRUE(w.write(a.data(), 10).ok());
    EXPECT_TRUE(has(w.write(a.data(), 7), "'a': a write of 7 bytes goes past its end (10 of 16"));
    ASSERT_TRUE(w.write(a.data(), 6).ok());
    ASSERT_TRUE(w.write(a.data(), 3).ok());
    EXPECT_TRUE(has(w.write(a.data(), 1), "writing 1 bytes past the declared size"));
    ASSERT_TRUE(w.commit().ok());
    EXPECT_TRUE(has(w.commit(), "commit() called twice"));
    EXPECT_TRUE(has(w.write(a.data(), 1), "write() after commit()"));
  }
  auto r = SafetensorsReader::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ((*r)->entries().size(), 2u);
  {
    // 2^63 bytes each is declarable; a second one overflows the file's total size.
    SafetensorsWriter w(file("never.safetensors"));
    ASSERT_TRUE(w.declare("s1", DType::f32, {1ll << 61}).ok());
    EXPECT_TRUE(has(w.declare("s2", DType::f32, {1ll << 61}), "'s2': shape [2305843009213693952] is too large"));
    // The failed declare left the running total intact (a wrapped total would accept this).
    EXPECT_TRUE(has(w.declare("s3", DType::f32, {1ll << 61}), "too large"));
    EXPECT_TRUE(w.declare("s4", DType::u8, {1}).ok());
  }
  // Invalid UTF-8 in a name cannot go into the JSON header.
  {
    SafetensorsWriter w(file("utf8.safetensors"));
    ASSERT_TRUE(w.declare("bad\xff", DType::u8, {1}).ok());
    EXPECT_TRUE(has(w.begin(), "not valid UTF-8"));
  }
  // write_safetensors refuses views it cannot write.
  std::vector<float> m(12, 1.0f);
  TensorView full(m.data(), DType::f32, {3, 4});
  EXPECT_TRUE(has(write_safetensors(file("nc.safetensors"), {{"cols", full.cols(1, 3)}}), "is not contiguous"));
  TensorView dev = full;
  dev.device = Device{DeviceKind::cuda, 0};
  EXPECT_TRUE(has(write_safetensors(file("dev.safetensors"), {{"d", dev}}), "is on cuda:0, not on the host"));
  EXPECT_EQ(listing(), std::vector<std::string>{"x.safetensors"});
}

TEST_F(SafetensorsTest, TemporaryFileCollisionIsReported) {
  const std::string path = file("busy.safetensors");
  SafetensorsWriter first(path);
  ASSERT_TRUE(first.declare("a", DType::u8, {1}).ok());
  ASSERT_TRUE(first.begin().ok());
  SafetensorsWriter second(path);
  ASSERT_TRUE(second.declare("a", DType::u8, {1}).ok());
  Status s = second.begin();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("File exists"), std::string::npos) << s.message();
  // The second writer must not remove the first writer's temporary file.
}

TEST_F(SafetensorsTest, DiskFullIsAnErrorAndLeavesNothing) {
  // A file size limit stands in for a full disk: writes past it fail with EFBIG
  // (SIGXFSZ ignored so that the write returns an error instead of killing us).
  const std::string path = file("full.safetensors");
  write_all(path, "keep me");
  std::vector<uint8_t> big = pattern_bytes(3u << 20, 50);
  Status s;
  ASSERT_NO_FATAL_FAILURE(test::with_file_size_limit(1u << 20, [&] {
    SafetensorsWriter w(path);
    Status d = w.declare("big", DType::u8, {static_cast<int64_t>(big.size())});
    s = d.ok() ? w.begin() : d;
    if (s.ok()) s = w.write(big.data(), big.size());
    if (s.ok()) s = w.commit();
  }));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("disk full or file size limit"), std::string::npos) << s.message();
  EXPECT_TRUE(s.error().code == ErrorCode::io);
  EXPECT_EQ(read_all(path), "keep me");
  EXPECT_EQ(listing(), std::vector<std::string>{"full.safetensors"});
}

}  // namespace
}  // namespace ls
