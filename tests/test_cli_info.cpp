// `layerstream info` as the built binary (LS_TOOL_PATH): the dry run of --vram-budget and
// --budget (the planner's choice and the smallest budget that plans, the same numbers as
// the library's planner with the CUDA backend's documented figures, no device opened),
// its refusals (below the minimum, --device cpu with --vram-budget, flags without an
// effect), and --check (non-finite values planted into a tiny checkpoint are counted per
// tensor, exit 1; a clean file exits 0).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_test_util.h"
#include "description_util.h"
#include "exactness_util.h"
#include "exec/budget_plan.h"
#include "exec/plan.h"
#include "io/safetensors.h"
#include "model/h3/config.h"
#include "sample/schedule.h"

using namespace ls;

namespace {

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ls_cli_info_" + std::to_string(getpid()) + "_" + name)).string();
}

struct RunResult {
  int rc = -1;
  std::string out, err;
};

// `env` is put before the command ("LAYERSTREAM_ATTENTION=native").
RunResult run_info(const std::string& args, const std::string& env = "") {
  const std::string o = tmp("out.txt"), e = tmp("err.txt");
  const std::string cmd = env + (env.empty() ? "" : " ") + std::string(LS_TOOL_PATH) + " info " + args + " > " + o +
                          " 2> " + e;
  RunResult r;
  const int st = std::system(cmd.c_str());
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream fo(o), fe(e);
  r.out.assign(std::istreambuf_iterator<char>(fo), std::istreambuf_iterator<char>());
  r.err.assign(std::istreambuf_iterator<char>(fe), std::istreambuf_iterator<char>());
  std::remove(o.c_str());
  std::remove(e.c_str());
  return r;
}

// The issue-5 clip: 15 s at 1 MP with 500 text tokens, S = 111,274 on the h3 preset.
const std::string kClip = "--preset h3 --frames 362 --width 1024 --height 1024 --text-tokens 500";

// The library's answer for the same question: one denoiser call at sigma 1, the CUDA
// profile (cuDNN build), the given kv_tile.
exec::BudgetOptions cuda_options(const h3::H3Config& cfg, const h3::Conditioning& cond, int64_t kv_tile,
                                 const std::vector<float>& sigmas = {1.0f}) {
  exec::BudgetOptions bo = exec::budget_options_for(test::cuda_profile());
  bo.kv_tile = kv_tile;
  bo.modulation_rows = *exec::modulation_rows_for(cfg, cond, sigmas);
  return bo;
}

// Writes `bytes` at `offset` of the file.
void poke(const std::string& path, uint64_t offset, const void* bytes, size_t n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good());
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(n));
  ASSERT_TRUE(f.good());
}

}  // namespace

TEST(CliInfoDryRun, VramBudgetPrintsThePlanAndTheMinimum) {
  RunResult t = run_info(kClip + " --vram-budget 8G");
  ASSERT_EQ(t.rc, 0) << t.out << t.err;
  for (const char* line : {"dry run     --vram-budget 8.000 GiB", "(no device opened)", "assumed     workspace 290.5 MiB",
                           "assumed     kv_tile 8192", "plan        weights streamed", "residency   ",
                           "offloads    K/V on device; residual on device", "slices      attention ", "peak        ",
                           "PCIe        ", "minimum     "})
    EXPECT_NE(t.out.find(line), std::string::npos) << line << "\n" << t.out;

  RunResult r = run_info(kClip + " --vram-budget 8G --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& d = j["dry_run"];
  EXPECT_EQ(d["device"]["opened"], false);
  EXPECT_EQ(d["device"]["name"], "cuda");
  EXPECT_EQ(d["kv_tile"], 8192);
  // The same plan as the library's planner for the same inputs.
  const h3::H3Config cfg = *h3::h3_preset("h3");
  const h3::Conditioning cond = test::clip(362, 1024, 1024, 500);
  const exec::BudgetOptions bo = cuda_options(cfg, cond, 8192);
  const uint64_t budget = 8ull << 30;
  auto bp = exec::plan_total_budget(cfg, cond, budget, bo);
  ASSERT_TRUE(bp.ok()) << bp.error().message;
  const auto& p = d["plan"];
  EXPECT_EQ(p["resident_blocks"].get<int64_t>(), bp->resident_blocks);
  EXPECT_GT(bp->resident_blocks, 0);
  EXPECT_LT(bp->resident_blocks, 50);  // a budget that makes the planner choose, not a trivial one
  EXPECT_EQ(p["slots"].get<int64_t>(), bp->slots);
  EXPECT_EQ(p["attn_slice"].get<int64_t>(), bp->activations.attn_slice);
  EXPECT_EQ(p["mlp_slice"].get<int64_t>(), bp->activations.mlp_slice);
  EXPECT_EQ(p["predicted_peak_bytes"].get<uint64_t>(), bp->predicted_peak_bytes);
  EXPECT_LE(bp->predicted_peak_bytes, budget);
  EXPECT_EQ(p["bytes"]["workspace"].get<uint64_t>(), 304611328u);  // 290.5 MiB
  EXPECT_EQ(p["pcie_bytes_per_forward"]["total"].get<uint64_t>(), bp->pcie_bytes_per_forward());
  EXPECT_EQ(d["modulation_rows"].get<int64_t>(), bo.modulation_rows);

  // The minimum it names plans, and one byte less is refused naming the same minimum.
  const uint64_t minimum = d["minimum_bytes"].get<uint64_t>();
  EXPECT_EQ(minimum, *exec::min_total_budget(cfg, cond, bo));
  EXPECT_NE(t.out.find("minimum     " + format_bytes(minimum) + " (" + std::to_string(minimum) + " bytes)"),
            std::string::npos)
      << t.out;
  RunResult at = run_info(kClip + " --vram-budget " + std::to_string(minimum) + " --json");
  ASSERT_EQ(at.rc, 0) << at.err;
  EXPECT_LE(nlohmann::json::parse(at.out)["dry_run"]["plan"]["predicted_peak_bytes"].get<uint64_t>(), minimum);
  EXPECT_TRUE(nlohmann::json::parse(at.out)["dry_run"]["plan"]["kv_offload"].get<bool>());
}

TEST(CliInfoDryRun, BelowTheMinimumIsRefusedNamingIt) {
  const h3::H3Config cfg = *h3::h3_preset("h3");
  const h3::Conditioning cond = test::clip(362, 1024, 1024, 500);
  const uint64_t minimum = *exec::min_total_budget(cfg, cond, cuda_options(cfg, cond, 8192));
  RunResult r = run_info(kClip + " --vram-budget " + std::to_string(minimum - 1));
  EXPECT_EQ(r.rc, 2) << r.out << r.err;  // as forward would refuse: before any work, a usage error
  EXPECT_EQ(test::named_minimum_budget(r.err), static_cast<long long>(minimum)) << r.err;
  EXPECT_NE(r.out.find("plan        refused"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("minimum     " + format_bytes(minimum)), std::string::npos) << r.out;
  RunResult j = run_info(kClip + " --vram-budget 1G --json");
  EXPECT_EQ(j.rc, 2);
  const auto d = nlohmann::json::parse(j.out)["dry_run"];
  EXPECT_TRUE(d["plan"].is_null());
  EXPECT_EQ(test::named_minimum_budget(d["refused"].get<std::string>()), static_cast<long long>(minimum));
}

TEST(CliInfoDryRun, DeviceFactsStepsAndKvTile) {
  const h3::H3Config cfg = *h3::h3_preset("h3");
  const h3::Conditioning cond = test::clip(362, 1024, 1024, 500);
  // LAYERSTREAM_ATTENTION=native: the backend's default kv_tile would be 1024; --kv-tile
  // overrides either, and the minimum follows (K/V chunks are whole tiles).
  RunResult n = run_info(kClip + " --vram-budget 4G --json", "LAYERSTREAM_ATTENTION=native");
  ASSERT_EQ(n.rc, 0) << n.err;
  auto dn = nlohmann::json::parse(n.out)["dry_run"];
  EXPECT_EQ(dn["kv_tile"], 1024);
  EXPECT_EQ(dn["minimum_bytes"].get<uint64_t>(), *exec::min_total_budget(cfg, cond, cuda_options(cfg, cond, 1024)));
  RunResult k = run_info(kClip + " --vram-budget 4G --kv-tile 2048 --json");
  ASSERT_EQ(k.rc, 0) << k.err;
  auto dk = nlohmann::json::parse(k.out)["dry_run"];
  EXPECT_EQ(dk["kv_tile"], 2048);
  EXPECT_NE(dk["device"]["assumed"].dump().find("given (--kv-tile)"), std::string::npos);
  // --steps: the AdaLN tables of a whole generate schedule (more rows than one call).
  RunResult s = run_info(kClip + " --vram-budget 4G --steps 8 --json");
  ASSERT_EQ(s.rc, 0) << s.err;
  auto ds = nlohmann::json::parse(s.out)["dry_run"];
  auto sched = sample::make_simple_schedule(8, cond.shift_video, cond.shift_audio);
  ASSERT_TRUE(sched.ok());
  const int64_t rows = *exec::modulation_rows_for(cfg, cond, sched->video);
  EXPECT_GT(rows, nlohmann::json::parse(k.out)["dry_run"]["modulation_rows"].get<int64_t>());
  EXPECT_EQ(ds["modulation_rows"].get<int64_t>(), rows);
  EXPECT_EQ(ds["minimum_bytes"].get<uint64_t>(),
            *exec::min_total_budget(cfg, cond, cuda_options(cfg, cond, 8192, sched->video)));
  // --no-prefetch: one slot.
  RunResult np = run_info(kClip + " --vram-budget 8G --no-prefetch --json");
  ASSERT_EQ(np.rc, 0) << np.err;
  EXPECT_EQ(nlohmann::json::parse(np.out)["dry_run"]["plan"]["slots"], 1);
}

TEST(CliInfoDryRun, ActivationBudget) {
  const h3::H3Config cfg = *h3::h3_preset("h3");
  const h3::Conditioning cond = test::clip(362, 1024, 1024, 500);
  RunResult r = run_info(kClip + " --budget 6G --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto d = nlohmann::json::parse(r.out)["dry_run"];
  EXPECT_EQ(d["device"]["name"], "cpu");
  auto p = exec::plan_for_budget(cfg, cond, 6ull << 30, 1024);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(d["plan"]["attn_slice"].get<int64_t>(), p->attn_slice);
  EXPECT_GT(p->attn_slice, 0);  // sliced: the stock plan needs 11 GiB
  EXPECT_EQ(d["plan"]["predicted_peak_bytes"].get<uint64_t>(), p->predicted_peak_bytes);
  const uint64_t minimum = d["minimum_bytes"].get<uint64_t>();
  EXPECT_TRUE(exec::plan_for_budget(cfg, cond, minimum, 1024).ok());
  RunResult low = run_info(kClip + " --budget " + std::to_string(minimum - 1));
  EXPECT_EQ(low.rc, 2);
  EXPECT_NE(low.err.find("the smallest budget that works is " + format_bytes(minimum) + " (" +
                         std::to_string(minimum) + " bytes"),
            std::string::npos)
      << low.err;
  RunResult t = run_info(kClip + " --budget 6G");
  ASSERT_EQ(t.rc, 0);
  EXPECT_NE(t.out.find("minimum     " + format_bytes(minimum)), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("activations only"), std::string::npos) << t.out;
}

// At 3 GiB (hopper's figures: kv_tile 8192, 605 TFLOP/s) the planner takes one block
// slot and says why; --keep-prefetch keeps two, with smaller slices and more K/V traffic.
TEST(CliInfoDryRun, OneSlotChosenAndKeepPrefetch) {
  const std::string a = kClip + " --sigma 0.9 --vram-budget 3G --attention hopper";
  RunResult one = run_info(a), two = run_info(a + " --keep-prefetch");
  ASSERT_EQ(one.rc, 0) << one.err;
  ASSERT_EQ(two.rc, 0) << two.err;
  EXPECT_NE(one.out.find("through 1 slot of 735.0 MiB (no prefetch: the planner gave the second slot's bytes"),
            std::string::npos)
      << one.out;
  EXPECT_NE(one.out.find("attention 16000 rows"), std::string::npos) << one.out;
  EXPECT_NE(two.out.find("through 2 slots of 735.0 MiB (prefetch)"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("attention 9344 rows"), std::string::npos) << two.out;
  RunResult j = run_info(a + " --json");
  ASSERT_EQ(j.rc, 0) << j.err;
  const auto p = nlohmann::json::parse(j.out)["dry_run"]["plan"];
  EXPECT_EQ(p["slots"].get<int64_t>(), 1);
  EXPECT_FALSE(p["prefetch"].get<bool>());
  EXPECT_TRUE(p["one_slot_chosen"].get<bool>());
}

TEST(CliInfoDryRun, Refusals) {
  // The CPU has no device memory to budget: pointed at --budget.
  RunResult cpu = run_info(kClip + " --vram-budget 8G --device cpu");
  EXPECT_EQ(cpu.rc, 2);
  EXPECT_NE(cpu.err.find("--budget"), std::string::npos) << cpu.err;
  EXPECT_TRUE(cpu.out.empty()) << cpu.out;  // refused before anything is described
  // Flags that have no effect in the combination, and bad values.
  const std::pair<std::string, std::string> cases[] = {
      {kClip + " --kv-tile 1024", "--kv-tile has no effect"},
      {kClip + " --device cuda", "--device has no effect"},
      {kClip + " --budget 4G --steps 4", "--steps goes with --vram-budget"},
      {kClip + " --budget 4G --no-prefetch", "--no-prefetch goes with --vram-budget"},
      {kClip + " --budget 4G --keep-prefetch", "--keep-prefetch goes with --vram-budget"},
      {kClip + " --vram-budget 3G --keep-prefetch --no-prefetch", "not both"},
      {kClip + " --vram-budget 4G --steps 4 --sigma 0.5", "not both"},
      {kClip + " --vram-budget 4G --budget 1G", "not both"},
      {"--preset h3 --vram-budget 4G", "needs a clip"},
      {"--preset h3 --frames 362 --width 1024 --height 1024 --vram-budget 4G", "--text-tokens"},
      {kClip + " --vram-budget ''", "--vram-budget"},
      {kClip + " --vram-budget 8GB", "--vram-budget"},
      {kClip + " --vram-budget 8G --device tpu", "--device must be cpu, cuda or cuda:N"},
      {kClip + " --vram-budget 8G --sigma 0", "--sigma"},
      {kClip + " --vram-budget 8G --kv-tile 0x10", "--kv-tile"},
      {"--preset h3 --check", "--check"},
  };
  for (const auto& [args, want] : cases) {
    RunResult r = run_info(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(want), std::string::npos) << args << "\n" << r.err;
  }
  EXPECT_EQ(run_info(kClip + " --vram-budget 8G --device cuda:1").rc, 0);
}

TEST(CliInfoCheck, PlantedNonFiniteValuesAreCountedPerTensor) {
  const std::string path = tmp("tiny.safetensors");
  {
    const std::string cmd = std::string(LS_TOOL_PATH) + " make-model --preset tiny --seed 4 -q -o " + path + " > /dev/null 2>&1";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  // A clean file: exit 0, every floating-point tensor counted.
  RunResult clean = run_info("--check " + path);
  ASSERT_EQ(clean.rc, 0) << clean.out << clean.err;
  EXPECT_NE(clean.out.find("result      all "), std::string::npos) << clean.out;
  EXPECT_NE(clean.out.find("floating-point tensors finite"), std::string::npos) << clean.out;

  // Plant NaN and +inf into a bf16 tensor and -inf into an f32 tensor, through the
  // header's offsets.
  std::string bf16_name, f32_name;
  uint64_t bf16_at = 0, f32_at = 0;
  size_t tensors = 0;
  {
    auto f = SafetensorsReader::open(path);
    ASSERT_TRUE(f.ok()) << f.error().message;
    tensors = (*f)->entries().size();
    for (const auto& e : (*f)->entries()) {
      if (bf16_name.empty() && e.dtype == DType::bf16 && e.numel() >= 16) {
        bf16_name = e.name;
        bf16_at = (*f)->data_start() + e.begin;
      }
      if (f32_name.empty() && e.dtype == DType::f32 && e.numel() >= 4) {
        f32_name = e.name;
        f32_at = (*f)->data_start() + e.begin;
      }
    }
  }
  ASSERT_FALSE(bf16_name.empty());
  ASSERT_FALSE(f32_name.empty());
  const uint16_t nan16 = 0x7FC1, inf16 = 0x7F80;
  const uint32_t ninf32 = 0xFF800000u;
  poke(path, bf16_at + 5 * 2, &nan16, 2);
  poke(path, bf16_at + 9 * 2, &inf16, 2);
  poke(path, bf16_at + 11 * 2, &nan16, 2);
  poke(path, f32_at + 3 * 4, &ninf32, 4);

  RunResult bad = run_info("--check " + path);
  EXPECT_EQ(bad.rc, 1) << bad.out << bad.err;
  EXPECT_NE(bad.out.find("non-finite  " + bf16_name + "  bf16"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("NaN 2, +inf 1, -inf 0 (first at element 5"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("non-finite  " + f32_name + "  f32"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("NaN 0, +inf 0, -inf 1 (first at element 3"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("result      4 non-finite values (NaN 2, +inf 1, -inf 1) in 2 of "), std::string::npos)
      << bad.out;
  EXPECT_NE(bad.err.find("error: " + path + " holds 4 non-finite values"), std::string::npos) << bad.err;

  RunResult j = run_info("--check " + path + " --json");
  EXPECT_EQ(j.rc, 1);
  const auto d = nlohmann::json::parse(j.out);
  EXPECT_EQ(d["tensors"].get<size_t>(), tensors);
  EXPECT_EQ(d["finite"], false);
  EXPECT_EQ(d["nonfinite"]["values"], 4);
  EXPECT_EQ(d["nonfinite"]["tensors"], 2);
  ASSERT_EQ(d["nonfinite_tensors"].size(), 2u);
  for (const auto& t : d["nonfinite_tensors"]) {
    if (t["name"] == bf16_name) {
      EXPECT_EQ(t["nan"], 2);
      EXPECT_EQ(t["pos_inf"], 1);
      EXPECT_EQ(t["neg_inf"], 0);
      EXPECT_EQ(t["first_index"], 5);
    } else {
      EXPECT_EQ(t["name"], f32_name);
      EXPECT_EQ(t["neg_inf"], 1);
      EXPECT_EQ(t["first_index"], 3);
    }
  }
  std::filesystem::remove(path);
  // A file that cannot be read is a runtime failure (1) with the reader's message.
  RunResult missing = run_info("--check " + path);
  EXPECT_EQ(missing.rc, 1);
  EXPECT_NE(missing.err.find(path), std::string::npos) << missing.err;
}

TEST(CliInfoCheck, EveryFloatDtypeAndLargeTensors) {
  // f64, f16, fp8 e4m3fn and a tensor of more than one 4096-element block, whose only
  // non-finite value sits in a later block; an integer tensor is not scanned.
  const std::string path = tmp("dtypes.safetensors");
  std::vector<uint64_t> f64(10, 0x3FF0000000000000ull);
  f64[7] = 0xFFF0000000000000ull;  // -inf
  std::vector<uint16_t> f16(10, 0x3C00);
  f16[2] = 0x7E00;                        // NaN
  f16[4] = 0x7C00;                        // +inf
  std::vector<uint8_t> f8(10, 0x38);      // 1.0
  f8[9] = 0xFF;                           // NaN (S.1111.111); 0x7E (448) is finite
  f8[1] = 0x7E;
  std::vector<float> big(10000, 1.5f);
  big[9000] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int32_t> ints(8, -1);       // 0xFFFFFFFF: a NaN pattern were it a float
  ASSERT_TRUE(write_safetensors(path, {{"f64", TensorView(f64.data(), DType::f64, {10})},
                                       {"f16", TensorView(f16.data(), DType::f16, {10})},
                                       {"f8", TensorView(f8.data(), DType::f8e4m3, {10})},
                                       {"big", TensorView(big.data(), DType::f32, {100, 100})},
                                       {"ints", TensorView(ints.data(), DType::i32, {8})}})
                  .ok());
  RunResult j = run_info("--check " + path + " --json");
  EXPECT_EQ(j.rc, 1) << j.err;
  const auto d = nlohmann::json::parse(j.out);
  EXPECT_EQ(d["integer_tensors"], 1);
  EXPECT_EQ(d["scanned_tensors"], 4);
  EXPECT_EQ(d["nonfinite"]["values"], 5);
  std::map<std::string, nlohmann::json> by;
  for (const auto& t : d["nonfinite_tensors"]) by[t["name"].get<std::string>()] = t;
  ASSERT_EQ(by.size(), 4u);
  EXPECT_EQ(by["f64"]["neg_inf"], 1);
  EXPECT_EQ(by["f64"]["first_index"], 7);
  EXPECT_EQ(by["f16"]["nan"], 1);
  EXPECT_EQ(by["f16"]["pos_inf"], 1);
  EXPECT_EQ(by["f16"]["first_index"], 2);
  EXPECT_EQ(by["f8"]["nan"], 1);
  EXPECT_EQ(by["f8"]["first_index"], 9);
  EXPECT_EQ(by["big"]["nan"], 1);
  EXPECT_EQ(by["big"]["first_index"], 9000);
  std::filesystem::remove(path);
}

// info --devices: the CPU (and every CUDA GPU the build and driver can open) with the
// numerics attention auto resolves to; JSON with --json; other flags refused.
TEST(CliInfoDevices, ListsTheCpuWithItsNumerics) {
  const auto text = ls::test::run_tool("info --devices");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("devices of this build"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("numerics: attention native, kv_tile 1024, fp32 GEMM lanes16"), std::string::npos) << text.out;

  const auto js = ls::test::run_tool("info --devices --json", "", /*merge_stderr=*/false);
  ASSERT_EQ(js.code, 0) << js.out;
  const auto j = nlohmann::json::parse(js.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << js.out;
  ASSERT_TRUE(j["devices"].is_array() && !j["devices"].empty()) << js.out;
  const auto& cpu = j["devices"][0];
  EXPECT_EQ(cpu["device"], "cpu");
  EXPECT_EQ(cpu["numerics_head_dim_128"]["attention"], "native");
  EXPECT_EQ(cpu["numerics_other_head_dims"]["attention"], "native");
  // The algorithms each device runs (issue 26: the CPU runs the int8 reference too).
  EXPECT_EQ(cpu["attention_algorithms"], nlohmann::json::array({"native", "int8"})) << cpu.dump();
  EXPECT_NE(text.out.find("attention algorithms (head dim 128): native, int8"), std::string::npos) << text.out;
  // Every CUDA entry names its device and either its numerics or why it is unusable.
  for (size_t i = 1; i < j["devices"].size(); ++i) {
    const auto& d = j["devices"][i];
    EXPECT_EQ(d["device"].get<std::string>().rfind("cuda:", 0), 0u) << d.dump();
    EXPECT_TRUE(d.contains("error") || d.contains("numerics_head_dim_128")) << d.dump();
  }

  // A setting the CPU cannot honour is listed as its reason, not a failure of the listing.
  const auto cudnn = ls::test::run_tool("info --devices --attention cudnn");
  ASSERT_EQ(cudnn.code, 0) << cudnn.out;
  EXPECT_NE(cudnn.out.find("unusable: cpu: the cpu backend has no cuDNN attention"), std::string::npos) << cudnn.out;

  const auto mixed = ls::test::run_tool("info --devices --preset h3");
  EXPECT_EQ(mixed.code, 2) << mixed.out;
  EXPECT_NE(mixed.out.find("--devices lists the devices and takes no other flag"), std::string::npos) << mixed.out;
}
