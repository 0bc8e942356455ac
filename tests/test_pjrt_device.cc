// The PJRT device on XLA's CPU plugin (scripts/install-deps.sh installs it): the plugin's errors,
// programs cached per shape and across processes, deferred and compiled graphs run whole as one
// program each, FLUX.1's Diffusers golden in the three modes, and model offload across the
// device's own address space. (The op harness and the goldens of every pipeline also run on
// pjrt:0: tests/CMakeLists.txt, label pjrt.)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "devices/pjrt/pjrt_runtime.h"
#include "devices/pjrt/plugin.h"
#include "devices/runtime.h"
#include "exec/compile.h"
#include "exec/counters.h"
#include "exec/deferred.h"
#include "exec/executable_store.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "call_args.h"
#include "golden.h"
#include "pipelines/flux_pipeline.h"
#include "spawn_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const Device kPjrt{DeviceType::pjrt, 0};

uint64_t device_counter(const std::string& name) { return runtime(kPjrt).device_counters().at(name); }
// Programs made ready in this process: compiled, or read from the on-disk cache when one is set.
uint64_t programs_prepared() { return device_counter("programs_compiled") + device_counter("programs_loaded_from_disk"); }

std::vector<float> values(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * float((i * 7) % 13 - 6);
  return v;
}

TEST(PjrtPlugin, AMissingPluginIsOneLineNamingThePath) {
  test::expect_error([] { pjrt::Client("/nonexistent/pjrt_plugin.so"); },
                     {"[device]", "/nonexistent/pjrt_plugin.so", "does not exist", "KILN_PJRT_PLUGIN"});
}

TEST(PjrtPlugin, ALibraryThatIsNoPluginIsNamed) {
  std::string library;
  for (const char* candidate : {"/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                                "/lib64/libm.so.6", "/usr/lib64/libm.so.6"})
    if (fs::exists(candidate)) library = candidate;
  ASSERT_FALSE(library.empty()) << "no libm to load";
  test::expect_error([&] { pjrt::Client c(library); }, {"[device]", library, "no GetPjrtApi", "not a PJRT plugin"});
}

TEST(PjrtPlugin, TheCpuPluginServesItsPlatformAndDevices) {
  const pjrt::Client client(pjrt::plugin_path());
  EXPECT_EQ(client.platform_name(), "cpu");
  EXPECT_GE(client.device_count(), 1);
  EXPECT_EQ(client.api_version().rfind("0.", 0), 0u) << client.api_version();
}

TEST(PjrtDevice, TensorsLiveInTheDevicesOwnMemory) {
  EXPECT_FALSE(runtime(kPjrt).is_host());
  const size_t before = runtime(kPjrt).memory().in_use_bytes;
  const Tensor x = to(from_vector(values(24, 0.5f), {4, 6}), kPjrt);
  EXPECT_EQ(x.device(), kPjrt);
  EXPECT_EQ(runtime(kPjrt).memory().in_use_bytes, before + 24 * sizeof(float));
  EXPECT_EQ(to_vector(x), values(24, 0.5f));  // there and back, bit for bit
  // A part of a buffer written from the host lands where it should (a copy into a slice).
  const Tensor part = from_vector({100, 200, 300}, {3});
  runtime(kPjrt).wait_for(runtime(kPjrt).copy(part.buffer(), 0, x.buffer(), 8, 12));
  std::vector<float> want = values(24, 0.5f);
  want[2] = 100, want[3] = 200, want[4] = 300;
  EXPECT_EQ(to_vector(x), want);
}

TEST(PjrtDevice, AnOpCompilesOncePerShapeAndDtype) {
  const DefaultDeviceGuard on(kPjrt);
  const Tensor a = to(from_vector(values(12, 1.f), {3, 4}), kPjrt), b = to(from_vector(values(12, .25f), {3, 4}), kPjrt);
  const uint64_t compiled = programs_prepared();
  const std::vector<float> first = to_vector(a * b + a);
  const uint64_t after_first = programs_prepared();
  EXPECT_GT(after_first, compiled);
  const uint64_t reused = device_counter("programs_reused");
  const Tensor c = to(from_vector(values(12, -2.f), {3, 4}), kPjrt);
  const std::vector<float> second = to_vector(c * b + c);
  EXPECT_EQ(programs_prepared(), after_first) << "same shapes and dtypes: nothing compiles";
  EXPECT_GE(device_counter("programs_reused"), reused + 2);
  for (size_t i = 0; i < second.size(); ++i) EXPECT_EQ(second[i], values(12, -2.f)[i] * values(12, .25f)[i] + values(12, -2.f)[i]);
  to_vector(to(from_vector(values(20, 1.f), {5, 4}), kPjrt) * 2.0);
  EXPECT_GT(programs_prepared(), after_first) << "a new shape compiles";
}

TEST(PjrtDevice, DeferredModeRunsEachFlushedGraphAsOneProgram) {
  const DefaultDeviceGuard on(kPjrt);
  const Tensor x = to(from_vector(values(32, .1f), {4, 8}), kPjrt), w = to(from_vector(values(48, .05f), {6, 8}), kPjrt);
  auto model = [&] { return softmax(silu(linear(x, w)) * 0.5 + 1.0, -1); };
  const std::vector<float> eager = to_vector(model());
  reset_deferred_stats();
  const uint64_t graphs = device_counter("whole_graphs_run");
  std::vector<float> deferred;
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    deferred = to_vector(model());
  }
  EXPECT_EQ(deferred_stats().graphs_run, 1u);
  EXPECT_EQ(device_counter("whole_graphs_run"), graphs + 1) << "one program for the flushed graph";
  EXPECT_EQ(deferred, eager) << "XLA's fused program gives strict eager's bits";
}

// Each pipeline's tiny golden on pjrt:0 from the seed alone, in the three modes: strict eager,
// deferred and compiled (the whole transformer, then its repeated blocks) give Diffusers' image
// within one level; kiln compiles one executable for the whole transformer; neither a second
// call nor a new step count compiles anything.
class PjrtGolden : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    clear_executable_cache();
    reset_compile_stats();
    set_executable_cache_dir({});
  }
  static std::unique_ptr<DiffusionPipeline> pipe(const std::string& set) {
    PipelineOptions options;
    const PipelineCallArgs args = test::fixture_call_args(set);
    options.text_encoder_out_layers = args.text_encoder_out_layers;
    std::unique_ptr<DiffusionPipeline> p = DiffusionPipeline::from_pretrained(test::pipeline_dir(set), options);
    p->to(kPjrt);
    return p;
  }
};

TEST_P(PjrtGolden, ThreeModesGiveDiffusersImageFromTheSeed) {
  const std::string set = GetParam();
  PipelineCallArgs args = test::fixture_call_args(set);
  args.seed = 0;  // the fixtures' noise came from torch.Generator("cpu").manual_seed(0)
  const std::vector<uint8_t> diffusers = test::golden_u8(set, "image.uint8");
  PipelineOutput eager;
  {
    EagerModeGuard strict(EagerMode::DeferNever);
    eager = (*pipe(set))(args);
  }
  EXPECT_LE(test::byte_diff(eager.image, diffusers).second, 1) << set << " strict eager on pjrt";
  {
    EagerModeGuard deferred(EagerMode::DeferAndFuse);
    const uint64_t graphs = device_counter("whole_graphs_run");
    const PipelineOutput out = (*pipe(set))(args);
    EXPECT_GT(device_counter("whole_graphs_run"), graphs);
    EXPECT_LE(test::byte_diff(out.image, diffusers).second, 1) << set << " deferred on pjrt";
    const auto [differing, most] = test::byte_diff(out.image, eager.image);
    std::printf("%s: pjrt deferred vs strict eager: %zu of %zu channels differ, by at most %d\n", set.c_str(),
                differing, eager.image.size(), most);
  }
  for (const CompileScope scope : {CompileScope::kFull, CompileScope::kRepeatedBlocks}) {
    const char* what = scope == CompileScope::kFull ? "whole transformer" : "repeated blocks";
    std::unique_ptr<DiffusionPipeline> p = pipe(set);
    p->compile_transformer(scope);
    const uint64_t compiles = compile_stats().compiles;
    const PipelineOutput out = (*p)(args);
    EXPECT_LE(test::byte_diff(out.image, diffusers).second, 1) << set << " " << what;
    const auto [differing, most] = test::byte_diff(out.image, eager.image);
    std::printf("%s: pjrt compiled (%s) vs strict eager: %zu of %zu channels differ, by at most %d\n", set.c_str(),
                what, differing, eager.image.size(), most);
    if (scope == CompileScope::kFull) EXPECT_EQ(compile_stats().compiles - compiles, 1u) << set << " " << what;
    else EXPECT_GE(compile_stats().compiles - compiles, 1u) << set << " " << what;
    const uint64_t programs = device_counter("programs_compiled");
    (*p)(args);
    EXPECT_EQ(device_counter("programs_compiled"), programs) << set << " " << what << ": a second call compiles nothing";
    PipelineCallArgs more_steps = args;
    more_steps.num_inference_steps = args.num_inference_steps + 2;
    const uint64_t kiln_compiles = compile_stats().compiles;
    const uint64_t transformer_programs = device_counter("programs_compiled");
    (*p)(more_steps);
    EXPECT_EQ(compile_stats().compiles, kiln_compiles) << set << " " << what << ": a new step count traces nothing";
    // The transformer's executables take timestep and sigma as inputs: no program has the step
    // count in it.
    EXPECT_EQ(device_counter("programs_compiled"), transformer_programs)
        << set << " " << what << ": a new step count compiles no PJRT program";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PjrtGolden, testing::Values("flux1_tiny_arch", "sd35_tiny_arch", "flux2_tiny"));

// Model CPU offload on pjrt:0: each component's weights cross into the device's memory when its
// turn comes and leave after, the image is the one of every component placed there, and the
// device's peak stays within the largest component plus the call's activations.
class PjrtFlux : public testing::Test {
 protected:
  static constexpr const char* kSet = "flux1_tiny_arch";
  static FluxPipeline pipe() {
    FluxPipeline p = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
    p.to(kPjrt);
    return p;
  }
};

TEST_F(PjrtFlux, ModelOffloadCrossesTheAddressSpaceWithinTheLargestComponent) {
  const PipelineCallArgs args = test::fixture_call_args(kSet);
  std::vector<uint8_t> placed;
  size_t placed_peak = 0;  // every component on the device (to), weights included
  {
    synchronize(kPjrt);
    runtime(kPjrt).reset_peak_memory();
    const size_t before = runtime(kPjrt).memory().in_use_bytes;
    const FluxPipeline all = pipe();
    placed = all(args).image;
    synchronize(kPjrt);
    placed_peak = runtime(kPjrt).memory().peak_bytes - before;
  }
  FluxPipeline p = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
  p.enable_model_cpu_offload(kPjrt);
  const MemoryEstimate estimate = p.estimate_memory(args);
  synchronize(kPjrt);
  runtime(kPjrt).reset_peak_memory();
  const size_t resident = runtime(kPjrt).memory().in_use_bytes;
  EXPECT_EQ(p(args).image, placed);
  synchronize(kPjrt);
  const size_t peak = runtime(kPjrt).memory().peak_bytes - resident;
  size_t bound = 0, all_weights = 0;
  for (const ComponentMemory& m : estimate.components) {
    bound = std::max(bound, m.weight_bytes + m.activation_bytes);
    all_weights += m.weight_bytes;
  }
  bound += estimate.carried_bytes;
  std::printf("pjrt offload peak %zu bytes, largest component + activations %zu, all weights %zu, every component "
              "placed %zu\n", peak, bound, all_weights, placed_peak);
  EXPECT_LE(peak, bound);
  EXPECT_LT(peak, placed_peak) << "never every component on the device at once";
  // A budget below the largest component fails before any work, naming it.
  runtime(kPjrt).set_memory_capacity(resident + bound / 4);
  test::expect_error([&] { p(args); }, {"[memory]", "transformer", "capacity"});
  runtime(kPjrt).set_memory_capacity(0);
}

using test::run_command;

// What a user runs: the bundled checkpoint on pjrt from the seed gives Diffusers' image.
TEST(PjrtCli, GenerateOnPjrtGivesDiffusersImage) {
  const test::ScopedTempDir dir("pjrt_generate");
  const fs::path png = dir.path() / "pjrt.png";
  const auto [code, output] = run_command(std::string(KILN_CLI_PATH) + " generate --device pjrt --seed 0 --out " + png.string());
  ASSERT_EQ(code, 0) << output;
  const fs::path diffusers = fs::path(KILN_FIXTURES_DIR) / "flux1_tiny_arch" / "image.png";
  const auto [same, compared] = run_command(std::string(KILN_CLI_PATH) + " compare " + png.string() + " " + diffusers.string());
  EXPECT_EQ(same, 0) << compared;
  EXPECT_NE(compared.find("; same (tolerance 1)"), std::string::npos) << compared;
}

// A missing plugin is one line naming it, before any work.
TEST(PjrtCli, AMissingPluginIsNamed) {
  const auto [code, output] =
      run_command(std::string(KILN_CLI_PATH) + " generate --device pjrt --pjrt-plugin /nonexistent/plugin.so --out /dev/null");
  EXPECT_NE(code, 0);
  EXPECT_NE(output.find("/nonexistent/plugin.so does not exist"), std::string::npos) << output;
}

// A second process finds the executables the first one compiled in the on-disk cache.
TEST(PjrtCli, ASecondProcessLoadsTheExecutablesFromDisk) {
  const test::ScopedTempDir dir("pjrt_cli");
  auto run = [&](const std::string& name) {
    const fs::path report = dir.path() / (name + ".json");
    const auto [code, output] = run_command("KILN_CACHE_DIR=" + (dir.path() / "cache").string() + " " + KILN_CLI_PATH +
                                            " generate --device pjrt --mode compile --steps 2 --out " +
                                            (dir.path() / (name + ".png")).string() + " --report " + report.string());
    EXPECT_EQ(code, 0) << output;
    std::ifstream in(report);
    return nlohmann::json::parse(in)["device_counters"];
  };
  const auto first = run("first"), second = run("second");
  EXPECT_GT(first["programs_compiled"].get<uint64_t>(), 0u);
  EXPECT_EQ(second["programs_compiled"].get<uint64_t>(), 0u) << second.dump();
  // (Two cache keys of one program text share one file: the first process read some back too.)
  EXPECT_EQ(second["programs_loaded_from_disk"].get<uint64_t>(),
            first["programs_compiled"].get<uint64_t>() + first["programs_loaded_from_disk"].get<uint64_t>());
}

// kiln generate --device pjrt --tp 2: two ranks in one process, one device each (here in strict
// eager mode, each collective one program over both devices), give the one-device image; each
// rank reads and holds only its slices of the transformer.
TEST(PjrtCli, TensorParallelOverTwoDevicesGivesTheOneDeviceImage) {
  const test::ScopedTempDir dir("pjrt_tp_cli");
  const auto run = [&](const std::string& name, const std::string& flags) {
    const fs::path report = dir.path() / (name + ".json");
    const auto [code, output] = run_command("KILN_CACHE_DIR=" + (dir.path() / "cache").string() + " " +
                                            KILN_CLI_PATH + " generate --device pjrt --seed 0 " + flags +
                                            " --out " + (dir.path() / (name + ".png")).string() + " --report " +
                                            report.string());
    EXPECT_EQ(code, 0) << output;
    std::ifstream in(report);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json one = run("one", "--mode eager"), two = run("two", "--mode eager --tp 2");
  const auto [same, compared] = run_command(std::string(KILN_CLI_PATH) + " compare " + (dir.path() / "one.png").string() +
                                            " " + (dir.path() / "two.png").string());
  EXPECT_EQ(same, 0) << compared;
  EXPECT_NE(compared.find("; same (tolerance 1)"), std::string::npos) << compared;
  const nlohmann::json& ranks = two["tensor_parallel"]["ranks"];
  ASSERT_EQ(ranks.size(), 2u) << two["tensor_parallel"].dump();
  const uint64_t whole_read = one["tensor_parallel"]["ranks"][0]["bytes_read"].get<uint64_t>();
  const uint64_t whole_peak = one["tensor_parallel"]["ranks"][0]["device_peak_bytes"].get<uint64_t>();
  for (const nlohmann::json& r : ranks) {
    EXPECT_LT(r["bytes_read"].get<uint64_t>(), whole_read) << r.dump();
    EXPECT_LT(r["device_peak_bytes"].get<uint64_t>(), whole_peak) << r.dump();
  }
  EXPECT_GT(two["device_counters"]["programs_run_with_other_ranks"].get<uint64_t>(), 0u);
}

// More ranks than the plugin has devices, and a degree the heads do not divide: one line each.
TEST(PjrtCli, TensorParallelBadDegreesAreOneLineEach) {
  const test::ScopedTempDir dir("pjrt_tp_bad");
  const auto [code, output] =
      run_command("KILN_PJRT_CPU_DEVICES=2 " + std::string(KILN_CLI_PATH) + " generate --device pjrt --tp 3 --out " +
                  (dir.path() / "three.png").string());
  EXPECT_EQ(code, 1);
  EXPECT_NE(output.find("--tp 3 runs one rank on each of pjrt:0 to pjrt:2, but [device] pjrt:2 is not available"),
            std::string::npos) << output;
  EXPECT_NE(output.find("KILN_PJRT_CPU_DEVICES"), std::string::npos) << output;
  const fs::path klein = fs::path(KILN_FIXTURES_DIR) / "flux2_klein_tiny" / "pipeline";
  const auto [heads_code, heads] =
      run_command(std::string(KILN_CLI_PATH) + " generate --device pjrt --tp 4 --model " + klein.string() +
                  " --prompt x --text-encoder-out-layers 1,2,3 --out " + (dir.path() / "heads.png").string());
  EXPECT_EQ(heads_code, 1);
  EXPECT_NE(heads.find("[tp] tp_degree (4) must divide num_attention_heads (4), num_key_value_heads (2)"),
            std::string::npos) << heads;
  EXPECT_EQ(std::count(output.begin(), output.end(), '\n'), 1) << output;
  EXPECT_FALSE(fs::exists(dir.path() / "three.png"));
  EXPECT_FALSE(fs::exists(dir.path() / "heads.png"));
}

}  // namespace
}  // namespace kiln
