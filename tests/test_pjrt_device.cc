// The PJRT device on XLA's CPU plugin (scripts/install-deps.sh installs it): the plugin's errors,
// programs cached per shape and across processes, deferred and compiled graphs run whole as one
// program each, FLUX.1's Diffusers golden in the three modes, and model offload across the
// device's own address space. (The op harness and the goldens of every pipeline also run on
// pjrt:0: tests/CMakeLists.txt, label pjrt.)
#include <array>
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
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const Device kPjrt{DeviceType::pjrt, 0};

uint64_t device_counter(const std::string& name) { return runtime(kPjrt).device_counters().at(name); }

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
  const uint64_t compiled = device_counter("programs_compiled");
  const std::vector<float> first = to_vector(a * b + a);
  const uint64_t after_first = device_counter("programs_compiled");
  EXPECT_GT(after_first, compiled);
  const uint64_t reused = device_counter("programs_reused");
  const Tensor c = to(from_vector(values(12, -2.f), {3, 4}), kPjrt);
  const std::vector<float> second = to_vector(c * b + c);
  EXPECT_EQ(device_counter("programs_compiled"), after_first) << "same shapes and dtypes: nothing compiles";
  EXPECT_GE(device_counter("programs_reused"), reused + 2);
  for (size_t i = 0; i < second.size(); ++i) EXPECT_EQ(second[i], values(12, -2.f)[i] * values(12, .25f)[i] + values(12, -2.f)[i]);
  to_vector(to(from_vector(values(20, 1.f), {5, 4}), kPjrt) * 2.0);
  EXPECT_GT(device_counter("programs_compiled"), after_first) << "a new shape compiles";
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

// FLUX.1's tiny golden on pjrt:0 in the three modes: eager and deferred match Diffusers as on
// the CPU; compiled mode (the whole transformer, then its repeated blocks) gives the same image,
// compiles once per executable, and neither a second call nor a new step count compiles.
class PjrtFlux : public testing::Test {
 protected:
  static constexpr const char* kSet = "flux1_tiny_arch";
  void SetUp() override {
    clear_executable_cache();
    reset_compile_stats();
    set_executable_cache_dir({});
  }
  static FluxPipeline pipe() {
    FluxPipeline p = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
    p.to(kPjrt);
    return p;
  }
};

TEST_F(PjrtFlux, ThreeModesMatchDiffusersAndEachOther) {
  const PipelineCallArgs args = test::fixture_call_args(kSet);
  const std::vector<uint8_t> diffusers = test::golden_u8(kSet, "image.uint8");
  PipelineOutput eager;
  {
    EagerModeGuard strict(EagerMode::DeferNever);
    eager = pipe()(args);
  }
  EXPECT_LE(test::byte_diff(eager.image, diffusers).second, 1) << "strict eager on pjrt";
  const std::string last = "latents.after_step" + std::to_string(args.num_inference_steps - 1);
  test::expect_close(eager.latents, test::golden(kSet, last), 1e-4, 0, "strict eager on pjrt: final latents");
  {
    EagerModeGuard deferred(EagerMode::DeferAndFuse);
    const PipelineOutput out = pipe()(args);
    EXPECT_LE(test::byte_diff(out.image, diffusers).second, 1) << "deferred on pjrt";
    const auto [differing, most] = test::byte_diff(out.image, eager.image);
    std::printf("pjrt deferred vs strict eager: %zu channels differ, by at most %d\n", differing, most);
    EXPECT_LE(most, 1);
  }
  for (const CompileScope scope : {CompileScope::kFull, CompileScope::kRepeatedBlocks}) {
    const char* what = scope == CompileScope::kFull ? "whole transformer" : "repeated blocks";
    FluxPipeline p = pipe();
    p.compile_transformer(scope);
    const uint64_t compiles = compile_stats().compiles;
    const PipelineOutput out = p(args);
    EXPECT_LE(test::byte_diff(out.image, diffusers).second, 1) << what;
    const auto [differing, most] = test::byte_diff(out.image, eager.image);
    std::printf("pjrt compiled (%s) vs strict eager: %zu channels differ, by at most %d\n", what, differing, most);
    EXPECT_LE(most, 1) << what;
    if (scope == CompileScope::kFull) EXPECT_EQ(compile_stats().compiles - compiles, 1u) << what;
    else EXPECT_GE(compile_stats().compiles - compiles, 1u) << what;
    const uint64_t programs = device_counter("programs_compiled");
    p(args);
    EXPECT_EQ(device_counter("programs_compiled"), programs) << what << ": a second call compiles nothing";
    PipelineCallArgs more_steps = args;
    more_steps.num_inference_steps = args.num_inference_steps + 2;
    const uint64_t kiln_compiles = compile_stats().compiles;
    p(more_steps);
    EXPECT_EQ(compile_stats().compiles, kiln_compiles) << what << ": a new step count traces nothing";
  }
}

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

// A second process finds the executables the first one compiled in the on-disk cache.
TEST(PjrtCli, ASecondProcessLoadsTheExecutablesFromDisk) {
  const test::ScopedTempDir dir("pjrt_cli");
  auto run = [&](const std::string& name) {
    const fs::path report = dir.path() / (name + ".json");
    const std::string cmd = "KILN_CACHE_DIR=" + (dir.path() / "cache").string() + " " + KILN_CLI_PATH +
                            " generate --device pjrt --mode compile --steps 2 --out " + (dir.path() / (name + ".png")).string() +
                            " --report " + report.string() + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string output;
    std::array<char, 4096> buf{};
    while (p && std::fgets(buf.data(), int(buf.size()), p)) output += buf.data();
    EXPECT_EQ(p ? ::pclose(p) : -1, 0) << output;
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

}  // namespace
}  // namespace kiln
