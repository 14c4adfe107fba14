// The CLI's one numeric-flag parser (cli/cli_util.h), tested directly: what it takes,
// what it refuses (empty, hex, '+', spaces, signs, non-finite, out of range, decimal
// units) and that every message names the flag, the range and the text. The commands'
// use of it is tested on the built binary in test_cli_flags.cpp.
#include <gtest/gtest.h>

#include <string>

// tools/ is not a library: the one translation unit under test is compiled in here.
#include "../cli/cli_util.cpp"

using namespace ls::cli;

namespace {

std::string int_error(const std::string& text, IntRange r = range::frames) {
  auto v = parse_int("--frames", text, r);
  return v.ok() ? std::string() : v.error().message;
}
std::string float_error(const std::string& text, FloatRange r = range::cfg) {
  auto v = parse_float("--cfg", text, r);
  return v.ok() ? std::string() : v.error().message;
}
std::string size_error(const std::string& text) {
  auto v = parse_size("--budget", text, range::budget);
  return v.ok() ? std::string() : v.error().message;
}

}  // namespace

TEST(CliParse, Integers) {
  EXPECT_EQ(*parse_int("--frames", "22", range::frames), 22);
  EXPECT_EQ(*parse_int("--frames", "007", range::frames), 7);  // decimal, not octal
  EXPECT_EQ(*parse_int("--seed", "9223372036854775807", range::seed), INT64_MAX);
  EXPECT_EQ(*parse_int("--seed", "0", range::seed), 0);
  for (const char* bad : {"", " 5", "5 ", "+5", "-1", "0x10", "1e3", "5.0", "22x", "١", "99999999999999999999999"}) {
    const std::string m = int_error(bad);
    ASSERT_FALSE(m.empty()) << "'" << bad << "' was accepted";
    EXPECT_NE(m.find("--frames"), std::string::npos) << m;
    EXPECT_NE(m.find("1..100000"), std::string::npos) << m;
    if (*bad) {
      EXPECT_NE(m.find(std::string("'") + bad + "'"), std::string::npos) << m;
    }
  }
  EXPECT_NE(int_error("").find("empty value"), std::string::npos);
  EXPECT_FALSE(int_error("100001").empty());
  EXPECT_FALSE(int_error("0").empty());
  EXPECT_FALSE(parse_int("--seed", "9223372036854775808", range::seed).ok());  // 2^63: out of the seed range
  // A signed range takes a '-' (none of the CLI's ranges is signed; the parser allows it).
  EXPECT_EQ(*parse_int("--x", "-3", IntRange{-5, 5}), -3);
  EXPECT_FALSE(parse_int("--x", "-", IntRange{-5, 5}).ok());
  EXPECT_FALSE(parse_int("--x", "--3", IntRange{-5, 5}).ok());
}

TEST(CliParse, Floats) {
  EXPECT_EQ(*parse_float("--cfg", "5", range::cfg), 5.0);
  EXPECT_EQ(*parse_float("--cfg", "2.5", range::cfg), 2.5);
  EXPECT_EQ(*parse_float("--cfg", ".5", range::cfg), 0.5);
  EXPECT_EQ(*parse_float("--cfg", "5.", range::cfg), 5.0);
  EXPECT_EQ(*parse_float("--cfg", "1e1", range::cfg), 10.0);
  EXPECT_EQ(*parse_float("--cfg", "0", range::cfg), 0.0);
  EXPECT_EQ(*parse_float("--cfg", "100", range::cfg), 100.0);
  for (const char* bad : {"", " 5", "5 ", "+5", "-1", "0x5", "0x1p3", "inf", "nan", "NaN", "1e99", "1e999", "100.5",
                          "1e", "e5", ".", "5,0", "5f"}) {
    const std::string m = float_error(bad);
    ASSERT_FALSE(m.empty()) << "'" << bad << "' was accepted";
    EXPECT_NE(m.find("--cfg"), std::string::npos) << m;
    EXPECT_NE(m.find("[0, 100]"), std::string::npos) << m;
  }
  // sigma is (0, 1]: 0 is refused, 1 taken.
  EXPECT_FALSE(parse_float("--sigma", "0", range::sigma).ok());
  EXPECT_EQ(*parse_float("--sigma", "1", range::sigma), 1.0);
  EXPECT_NE(parse_float("--sigma", "1.5", range::sigma).error().message.find("(0, 1]"), std::string::npos);
}

TEST(CliParse, Sizes) {
  EXPECT_EQ(*parse_size("--budget", "123456"), 123456u);
  EXPECT_EQ(*parse_size("--budget", "123456B"), 123456u);
  EXPECT_EQ(*parse_size("--budget", "512M"), 512ull << 20);
  EXPECT_EQ(*parse_size("--budget", "512m"), 512ull << 20);
  EXPECT_EQ(*parse_size("--budget", "3G"), 3ull << 30);
  EXPECT_EQ(*parse_size("--budget", "3.5GiB"), 7ull << 29);
  EXPECT_EQ(*parse_size("--budget", "1K"), 1024u);
  EXPECT_EQ(*parse_size("--budget", "0.5K"), 512u);
  EXPECT_EQ(*parse_size("--budget", "1T"), 1ull << 40);
  for (const char* bad : {"", "0", "lots", " 3G", "3G ", "3 G", "+3G", "-3G", "0x10", "1.5", "3GG", "3Gi", "1e3",
                          "2000000T", "99999999999999999999999"}) {
    const std::string m = size_error(bad);
    ASSERT_FALSE(m.empty()) << "'" << bad << "' was accepted";
    EXPECT_NE(m.find("--budget"), std::string::npos) << m;
    EXPECT_NE(m.find("1 B..1 EiB"), std::string::npos) << m;
  }
  // Decimal units: refused, naming the 1024-based spelling.
  const std::string m = size_error("3GB");
  EXPECT_NE(m.find("1024-based"), std::string::npos) << m;
  EXPECT_NE(m.find("GiB"), std::string::npos) << m;
}

TEST(CliParse, ExitCodes) {
  EXPECT_EQ(exit_code_for({ls::ErrorCode::invalid_argument, ""}), 2);
  EXPECT_EQ(exit_code_for({ls::ErrorCode::out_of_budget, ""}), 2);
  for (auto c : {ls::ErrorCode::invalid_file, ls::ErrorCode::io, ls::ErrorCode::not_found, ls::ErrorCode::unsupported,
                 ls::ErrorCode::out_of_memory, ls::ErrorCode::device, ls::ErrorCode::nonfinite})
    EXPECT_EQ(exit_code_for({c, ""}), 1) << ls::to_string(c);
}

TEST(CliParse, FlagTextGivenEmptyIsRefused) {
  // Not given: the default. Given empty (`--kv-tile ''`): refused, never the default.
  for (bool give : {false, true}) {
    CLI::App app;
    FlagText kv;
    add_int_flag(app, "--kv-tile", kv, range::kv_tile, "keys per tile", "the device's");
    std::vector<const char*> argv = {"prog"};
    if (give) argv.insert(argv.end(), {"--kv-tile", ""});
    app.parse(static_cast<int>(argv.size()), argv.data());
    EXPECT_EQ(kv.given(), give);
    EXPECT_EQ(kv.name, "--kv-tile");
    auto v = flag_int(kv, range::kv_tile, 1024);
    if (give) {
      ASSERT_FALSE(v.ok());
      EXPECT_NE(v.error().message.find("--kv-tile must be an integer in 1..2^30 (got an empty value)"),
                std::string::npos)
          << v.error().message;
    } else {
      ASSERT_TRUE(v.ok());
      EXPECT_EQ(*v, 1024);
    }
  }
}

// --keyframe FILE[@FRAME|@last]: one grammar for forward and generate. The suffix is split
// off only when it is a frame, so a path with '@' stays whole; the pixel frame comes from
// @last, @FRAME, the file's metadata or 0, and one past the clip's last frame is refused.
TEST(CliParse, KeyframeArgument) {
  struct Case {
    const char* arg;
    const char* path;
    int64_t frame;  // -1: none
    bool last;
  };
  for (const Case& c : {Case{"kf.safetensors", "kf.safetensors", -1, false},
                        Case{"kf.safetensors@3", "kf.safetensors", 3, false},
                        Case{"kf.safetensors@last", "kf.safetensors", -1, true},
                        Case{"shot@2x.safetensors", "shot@2x.safetensors", -1, false},
                        Case{"a@b@7", "a@b", 7, false}, Case{"trailing@", "trailing@", -1, false}}) {
    auto k = parse_keyframe_arg(c.arg);
    ASSERT_TRUE(k.ok()) << c.arg << ": " << k.error().message;
    EXPECT_EQ(k->path, c.path) << c.arg;
    EXPECT_EQ(k->frame.has_value(), c.frame >= 0) << c.arg;
    if (c.frame >= 0 && k->frame) {
      EXPECT_EQ(*k->frame, c.frame) << c.arg;
    }
    EXPECT_EQ(k->last, c.last) << c.arg;
  }
  auto big = parse_keyframe_arg("kf@99999999999");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message.find("--keyframe frame"), std::string::npos) << big.error().message;

  const auto frame_of = [](const char* arg, std::optional<std::string> meta, int64_t frames) {
    auto k = parse_keyframe_arg(arg);
    EXPECT_TRUE(k.ok());
    return keyframe_pixel_frame(*k, meta, frames);
  };
  EXPECT_EQ(*frame_of("kf", std::nullopt, 9), 0);
  EXPECT_EQ(*frame_of("kf", std::string("4"), 9), 4);
  EXPECT_EQ(*frame_of("kf@last", std::string("4"), 9), 8);
  EXPECT_EQ(*frame_of("kf@2", std::string("4"), 9), 2);  // the flag wins over the metadata
  auto past = frame_of("kf@9", std::nullopt, 9);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.error().message, "kf: keyframe at pixel frame 9 is past the clip's last frame 8");
  auto past_meta = frame_of("kf", std::string("12"), 9);
  ASSERT_FALSE(past_meta.ok());
  EXPECT_EQ(past_meta.error().message, "kf: keyframe at pixel frame 12 is past the clip's last frame 8");
  auto bad_meta = frame_of("kf", std::string("x"), 9);
  ASSERT_FALSE(bad_meta.ok());
  EXPECT_NE(bad_meta.error().message.find("kf metadata pixel_frame"), std::string::npos) << bad_meta.error().message;
}
