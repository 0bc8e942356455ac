// kiln plan's foundations and its local-device plans: a pipeline loaded for its shapes reads no
// checkpoint byte (nn/shapes_only_load.h), make-random's layout-only folders take no disk space,
// and `kiln plan` on the CPU states the estimate a real call makes, refusing with the flag that
// would fit. (The TPU plans, compiled with libtpu, are test_pjrt_plan.cc.)
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "io/mapped_file.h"
#include "nn/shapes_only_load.h"
#include "pipelines/diffusion_pipeline.h"
#include "spawn_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using test::run_command;

const fs::path kTiny = fs::path(KILN_FIXTURES_DIR) / "flux1_tiny_arch" / "pipeline";

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// Every parameter of the transformer by key and shape, the way a load gave them.
std::vector<std::pair<std::string, Shape>> layout(const DiffusionPipeline& pipe) {
  std::vector<std::pair<std::string, Shape>> out;
  for (const auto& [key, t] : pipe.transformer_parameters()) out.emplace_back(key, t.shape());
  return out;
}

// f32 from a bf16 checkpoint converts every weight, and a TP rank slices: both read the file,
// unless the load is for shapes only, which reads nothing and builds the same layout.
TEST(ShapesOnlyLoad, ReadsNoCheckpointByteAndKeepsTheLayout) {
  PipelineOptions options;
  options.dtype = DType::f32;
  options.tensor_parallel = TensorParallelConfig{DeviceMesh(ProcessGroup::detached(0, 2))};
  io::reset_bytes_read();
  const auto real = DiffusionPipeline::from_pretrained(kTiny, options);
  const uint64_t real_bytes = io::bytes_read();
  EXPECT_GT(real_bytes, 0u);
  io::reset_bytes_read();
  std::unique_ptr<DiffusionPipeline> shapes;
  {
    const nn::ShapesOnlyLoad shapes_only;
    shapes = DiffusionPipeline::from_pretrained(kTiny, options);
  }
  EXPECT_EQ(io::bytes_read(), 0u);
  EXPECT_EQ(layout(*shapes), layout(*real));
}

// The folder kiln plan --like writes: real headers, every tensor a hole.
TEST(LayoutOnlyFolder, HasTheModelsLayoutAndNoValues) {
  const test::ScopedTempDir dir("layout_only");
  const fs::path out = dir.path() / "klein";
  const auto [code, output] = run_command(std::string(KILN_CLI_PATH) + " make-random " + out.string() +
                                          " --like flux2-klein-4b --layout-only --blocks 1+1 --text-encoder-layers 3");
  ASSERT_EQ(code, 0) << output;
  uint64_t size = 0, allocated = 0;
  for (const auto& e : fs::recursive_directory_iterator(out)) {
    if (e.path().extension() != ".safetensors") continue;
    struct stat st {};
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    size += uint64_t(st.st_size);
    allocated += uint64_t(st.st_blocks) * 512;
  }
  EXPECT_GT(size, uint64_t(1) << 30) << "Qwen3-4B's embedding alone is ~0.8 GB";
  EXPECT_LT(allocated, size / 100) << "the values must be holes";
  const auto [plan_code, plan_output] = run_command(std::string(KILN_CLI_PATH) + " plan --model " + out.string() +
                                                    " --height 256 --width 256 --text-encoder-out-layers 1,2,3");
  EXPECT_NE(plan_code, 0) << "plan takes no generate flags";
  EXPECT_NE(plan_output.find("unknown flag '--text-encoder-out-layers' for plan"), std::string::npos) << plan_output;
}

// On the CPU the plan is the estimate the call itself checks before any work: the same
// component weights and traced activations as generate's report, without loading any value.
TEST(PlanCli, CpuPlanIsTheCallsOwnEstimate) {
  const test::ScopedTempDir dir("plan_cpu");
  const fs::path plan = dir.path() / "plan.json", run = dir.path() / "run.json";
  const auto [code, output] = run_command(std::string(KILN_CLI_PATH) +
                                          " plan --model " + kTiny.string() + " --height 128 --width 128 "
                                          "--max-sequence-length 32 --dtype auto --report " + plan.string());
  ASSERT_EQ(code, 0) << output;
  const auto [gen, gen_output] =
      run_command(std::string(KILN_CLI_PATH) + " generate --steps 1 --out " + (dir.path() / "x.png").string() +
                  " --report " + run.string());
  ASSERT_EQ(gen, 0) << gen_output;
  const nlohmann::json p = read_json(plan), estimate = read_json(run)["memory"]["estimate"];
  EXPECT_EQ(p["checkpoint_bytes_read"].get<uint64_t>(), 0u);
  ASSERT_EQ(p["components"].size(), estimate["components"].size()) << estimate.dump();
  for (const auto& a : p["components"]) {
    const std::string name = a["name"];
    ASSERT_TRUE(estimate["components"].contains(name)) << name;
    const auto& b = estimate["components"][name];
    EXPECT_EQ(a["weights_bytes"], b["weight_bytes"]) << name;
    EXPECT_EQ(a["activation_bytes"], b["activation_bytes"]) << name;
  }
  EXPECT_TRUE(p["fits"].get<bool>());
}

// A placement that does not fit exits 1 with one line naming what fits instead.
TEST(PlanCli, WhatDoesNotFitNamesTheFlagThatWould) {
  const test::ScopedTempDir dir("plan_misfit");
  const fs::path report = dir.path() / "plan.json";
  const std::string base = std::string(KILN_CLI_PATH) + " plan --model " + kTiny.string() +
                           " --height 128 --width 128 --max-sequence-length 32 --report " + report.string();
  ASSERT_EQ(run_command(base).first, 0);
  const nlohmann::json free = read_json(report);
  const int64_t all = free["placements"]["none"]["required_bytes"], one = free["placements"]["model"]["required_bytes"];
  ASSERT_LT(one, all);
  const int64_t between = (one + all) / 2;
  const auto [code, output] = run_command(base + " --device-memory " + std::to_string(between));
  EXPECT_EQ(code, 1) << output;
  EXPECT_NE(output.find("kiln: [plan] FluxPipeline at 128x128 with offload none"), std::string::npos) << output;
  EXPECT_NE(output.find("--offload model fits"), std::string::npos) << output;
  const auto [offload, offload_output] = run_command(base + " --device-memory " + std::to_string(between) +
                                                     " --offload model");
  EXPECT_EQ(offload, 0) << offload_output;
  EXPECT_TRUE(read_json(report)["fits"].get<bool>());
}

// Bad input: one line each, before any load.
TEST(PlanCli, BadFlagsAreOneLineEach) {
  const std::string kiln = KILN_CLI_PATH;
  const std::vector<std::pair<std::string, std::string>> cases = {
      {" plan", "plan needs one of --model DIR"},
      {" plan --like flux3", "--like flux3: expected flux1-schnell"},
      {" plan --like flux1-schnell --device tpu", "--device tpu needs --topology"},
      {" plan --like flux1-schnell --topology v6e:1x1", "--topology is for --device tpu"},
      {" plan --like flux1-schnell --tp 2 --offload model", "--tp 2 with --offload model"},
      {" plan --like flux1-schnell --offload sequential", "--offload sequential: expected none"},
      {" plan --model " + kTiny.string() + " --tp 3", "tp_degree (3) must divide the number of attention heads (4)"},
  };
  for (const auto& [args, expected] : cases) {
    const auto [code, output] = run_command(kiln + args);
    EXPECT_EQ(code, 1) << args << ": " << output;
    EXPECT_NE(output.find(expected), std::string::npos) << args << ": " << output;
  }
}

}  // namespace
}  // namespace kiln
