// kiln plan --device tpu: every component of a pipeline compiled ahead of time with libtpu for a
// TPU topology that is not there (scripts/install-deps.sh fetches libtpu), with XLA's memory
// figures per device, and tensor parallelism as one program per rank whose collectives are
// StableHLO's. The real-size plans are benchmarks (docs/tpu.md); these use the bundled checkpoint.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "devices/aot_target.h"
#include "exec/capture.h"
#include "exec/ops.h"
#include "graph/graph.h"
#include "spawn_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::run_command;

const std::string kTiny =
    (fs::path(KILN_FIXTURES_DIR) / "flux1_tiny_arch" / "pipeline").string() + " --height 128 --width 128 "
                                                                              "--max-sequence-length 32";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

const nlohmann::json& component(const nlohmann::json& plan, const std::string& name) {
  for (const auto& c : plan["components"])
    if (c["name"] == name) return c;
  throw std::runtime_error("no component " + name + " in " + plan.dump());
}

// FLUX.1 over two v6e chips: the transformer is one program per rank holding half its sharded
// weights, its collectives in the program text; the text encoders and the VAE are replicated
// (no collective: one replica's program); XLA's figures come back for each.
TEST(TpuPlan, TensorParallelFluxOverTwoV6eChips) {
  const test::ScopedTempDir dir("tpu_plan");
  const fs::path report = dir.path() / "tp2.json", programs = dir.path() / "programs",
                 single = dir.path() / "tp1.json";
  const std::string cache = "KILN_CACHE_DIR=" + (dir.path() / "cache").string() + " ";
  const std::string tpu_plan = cache + KILN_CLI_PATH + " plan --model " + kTiny + " --device tpu --topology v6e:2x2 --tp 2";
  const auto [code, output] =
      run_command(tpu_plan + " --report " + report.string() + " --dump " + programs.string());
  ASSERT_EQ(code, 0) << output;
  const auto [local, local_output] =
      run_command(std::string(KILN_CLI_PATH) + " plan --model " + kTiny + " --report " + single.string());
  ASSERT_EQ(local, 0) << local_output;
  const nlohmann::json p = read_json(report), one = read_json(single);
  EXPECT_NE(p["target"].get<std::string>().find("TPU v6 lite"), std::string::npos) << p["target"];
  EXPECT_GT(p["capacity_bytes"].get<int64_t>(), int64_t(16) << 30);
  EXPECT_EQ(p["checkpoint_bytes_read"].get<uint64_t>(), 0u);
  EXPECT_GT(p["compile_seconds"].get<double>(), 0);
  EXPECT_TRUE(p["fits"].get<bool>());

  const auto& t = component(p, "transformer");
  EXPECT_EQ(t["program"]["replicas"], 2);
  EXPECT_GT(t["program"]["collectives"]["all_reduce"].get<int>(), 0);
  EXPECT_GT(t["program"]["collectives"]["all_gather"].get<int>(), 0);
  // Half of every sharded weight; the norms, embedders and biases of rowwise layers stay whole.
  const int64_t sharded = t["weights_bytes"], whole = component(one, "transformer")["weights_bytes"];
  EXPECT_LT(sharded, whole * 3 / 4);
  EXPECT_GT(sharded, whole / 2);
  // The program's arguments are this rank's weights and the step's inputs.
  EXPECT_GE(t["program"]["argument_bytes"].get<int64_t>(), sharded * 9 / 10);
  for (const char* name : {"text_encoder", "text_encoder_2", "vae"}) {
    const auto& c = component(p, name);
    EXPECT_EQ(c["program"]["replicas"], 1) << name;
    EXPECT_EQ(c["weights_bytes"], component(one, name)["weights_bytes"]) << name;
    EXPECT_GT(c["program"]["total_bytes"].get<int64_t>(), 0) << name;
  }

  EXPECT_EQ(p["programs_compiled"], 4);
  EXPECT_EQ(p["programs_from_cache"], 0);

  // Planned again, every program's figures come from the on-disk cache: nothing compiles.
  const fs::path again = dir.path() / "again.json";
  const auto [code2, output2] = run_command(tpu_plan + " --report " + again.string());
  ASSERT_EQ(code2, 0) << output2;
  const nlohmann::json q = read_json(again);
  EXPECT_EQ(q["programs_compiled"], 0);
  EXPECT_EQ(q["programs_from_cache"], 4);
  EXPECT_EQ(component(q, "transformer")["program"]["total_bytes"], t["program"]["total_bytes"]);

  std::ifstream in(programs / "transformer.mlir");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_NE(text.find("mhlo.num_replicas = 2"), std::string::npos);
  EXPECT_NE(text.find("\"stablehlo.all_reduce\""), std::string::npos);
  EXPECT_NE(text.find("\"stablehlo.all_gather\""), std::string::npos);
  EXPECT_NE(text.find("replica_groups = dense<[[0, 1]]>"), std::string::npos);
}

// A program larger than a chip is refused by XLA's compiler: the plan's answer for that
// component ("does not fit one device", XLA's reason), not a failure of the plan.
TEST(TpuPlan, AProgramLargerThanAChipIsAnAnswer) {
  const Tensor a = placeholder_tensor({100000, 1000}, DType::f32), b = placeholder_tensor({1000, 100000}, DType::f32);
  const detail::Captured big = detail::capture("big", [&] {
    const Tensor s = sin(matmul(a, b));  // 40 GB of f32, twice over
    return std::vector<Tensor>{sum(s + transpose(s, 0, 1))};
  });
  const std::unique_ptr<AotTarget> v6e = AotTarget::open(DeviceType::tpu, "v6e:1x1");
  EXPECT_EQ(v6e->devices(), 1);
  const AotMemory m = v6e->compile("big", big.graph, 1);
  EXPECT_NE(m.does_not_fit.find("Ran out of memory on HBM"), std::string::npos) << m.does_not_fit;
  EXPECT_NE(m.does_not_fit.find("exceeds available HBM (31.24G)"), std::string::npos) << m.does_not_fit;
}

// Bad input: one line each, before anything loads.
TEST(TpuPlan, BadTopologiesAndDegreesAreOneLineEach) {
  const std::string plan = std::string(KILN_CLI_PATH) + " plan --model " + kTiny + " --device tpu";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" --topology v9x:1x1", "topology v9x:1x1 (--topology): the PJRT plugin"},
      {" --topology v6e:2x2 --tp 8", "--tp 8 needs 8 devices but topology v6e:2x2 has 4"},
      {" --topology v6e:1x1 --device-memory 1GiB", "--device-memory is for local devices"},
      {" --topology v6e:1x1 --quantize q8_0", "--quantize q8_0 with --device tpu: quantized weights do not lower"},
  };
  for (const auto& [args, expected] : cases) {
    const auto [code, output] = run_command(plan + args);
    EXPECT_EQ(code, 1) << args << ": " << output;
    EXPECT_NE(output.find(expected), std::string::npos) << args << ": " << output;
  }
}

}  // namespace
}  // namespace kiln
