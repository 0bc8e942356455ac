// Model CPU offload and the device memory budget (exec/residency.h): one
// component's weights on the device at a time, the same image as with every weight in place,
// a lower device peak, and a call that cannot fit failing before any work with the numbers.
#include <algorithm>
#include <set>

#include "devices/runtime.h"
#include "devices/cpu/kernels/prepacked_weights.h"
#include "exec/compile.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "call_args.h"
#include "golden.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

const char* kSet = "flux1_tiny_arch";

// Sets the CPU device's capacity for one test and lifts it afterwards.
class ModelOffload : public testing::Test {
 protected:
  void TearDown() override { runtime(Device::cpu()).set_memory_capacity(0); }
  static size_t peak_of(const FluxPipeline& pipe, const PipelineCallArgs& args, PipelineOutput* out) {
    synchronize(Device::cpu());
    runtime(Device::cpu()).reset_peak_memory();
    *out = pipe(args);
    synchronize(Device::cpu());
    return runtime(Device::cpu()).memory().peak_bytes;
  }
};

// Replays the event log: the set of resident components after each event.
std::vector<std::set<std::string>> residency(const std::vector<OffloadEvent>& events) {
  std::vector<std::set<std::string>> out;
  std::set<std::string> now;
  for (const OffloadEvent& e : events) {
    if (e.action == "onload") now.insert(e.component);
    else now.erase(e.component);
    out.push_back(now);
  }
  return out;
}

TEST_F(ModelOffload, OneComponentAtATimeTheSameImageAndALowerPeak) {
  const PipelineCallArgs args = test::fixture_call_args(kSet);
  PipelineOutput in_place, on_device, offloaded;
  {
    const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
    peak_of(pipe, args, &in_place);
  }
  size_t device_peak = 0, offload_peak = 0;
  MemoryEstimate estimate;
  {
    FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
    pipe.to(Device::cpu());
    device_peak = peak_of(pipe, args, &on_device);
  }
  {
    FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
    pipe.enable_model_cpu_offload();
    estimate = pipe.estimate_memory(args);
    offload_peak = peak_of(pipe, args, &offloaded);
    // The event log: model_cpu_offload_seq order, the transformer once for all steps, never two
    // components resident, nothing left at the end.
    std::vector<std::string> onloads;
    for (const OffloadEvent& e : pipe.offload_events())
      if (e.action == "onload") onloads.push_back(e.component);
    EXPECT_EQ(onloads, (std::vector<std::string>{"text_encoder", "text_encoder_2", "transformer", "vae"}));
    for (const auto& resident : residency(pipe.offload_events())) EXPECT_LE(resident.size(), 1u);
    EXPECT_TRUE(residency(pipe.offload_events()).back().empty());
    // A second call starts from the same state.
    pipe.clear_offload_events();
    PipelineOutput again;
    pipe(args);
    EXPECT_EQ(pipe.offload_events().size(), 8u);
  }
  EXPECT_EQ(on_device.image, in_place.image);
  EXPECT_EQ(offloaded.image, in_place.image);
  EXPECT_EQ(to_vector(offloaded.latents), to_vector(in_place.latents));
  // Peak: below everything-on-the-device, and within the largest component plus its activations.
  size_t bound = 0;
  for (const ComponentMemory& m : estimate.components) bound = std::max(bound, m.weight_bytes + m.activation_bytes);
  bound += estimate.carried_bytes;
  EXPECT_EQ(estimate.required, bound);
  EXPECT_LT(offload_peak, device_peak);
  EXPECT_LE(offload_peak, bound) << "offload peak " << offload_peak << ", largest component + activations " << bound;
  std::printf("device peak: to(cpu) %zu, offload %zu, bound %zu\n", device_peak, offload_peak, bound);
  for (const ComponentMemory& m : estimate.components)
    std::printf("  %s weights %zu activations %zu\n", m.name.c_str(), m.weight_bytes, m.activation_bytes);
}

// A capacity between what offload needs and what all-on-the-device needs: offload runs, the
// other placement fails before any work with a message naming every component and its sizes.
TEST_F(ModelOffload, ACapacityBetweenTheLargestComponentAndAllOfThemNeedsOffload) {
  PipelineCallArgs args = test::fixture_call_args(kSet);
  args.vae_tiling = VaeTilingMode::kOff;  // a tiled decode would fit too (test_vae_decode.cc)
  PipelineOutput reference;
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
  reference = pipe(args);
  pipe.to(Device::cpu());
  const MemoryEstimate all = pipe.estimate_memory(args);
  pipe.enable_model_cpu_offload();
  const MemoryEstimate one = pipe.estimate_memory(args);
  ASSERT_LT(one.required, all.required);
  const size_t capacity = (one.required + all.required) / 2;
  runtime(Device::cpu()).set_memory_capacity(capacity);

  // Everything on the device: to() succeeds when the weights alone fit, the call then fails
  // fast (no step ran: no event after the onloads).
  {
    FluxPipeline placed = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
    placed.to(Device::cpu());
    const size_t events_before = placed.offload_events().size();
    PipelineCallArgs counted = args;
    int steps = 0;
    counted.on_step = [&](int64_t, int64_t, double) { ++steps; };
    test::expect_error([&] { placed(counted); },
                       {"[memory]", "needs", "capacity", "text_encoder ", "text_encoder_2 ", "transformer ", "vae ",
                        "weights", "activations", "--offload model"});
    EXPECT_EQ(steps, 0);
    EXPECT_EQ(placed.offload_events().size(), events_before);
  }  // its device copies go back to the pool

  // Offload fits and gives the same image.
  const PipelineOutput out = pipe(args);
  EXPECT_EQ(out.image, reference.image);
  EXPECT_LE(runtime(Device::cpu()).memory().peak_bytes, capacity);
}

TEST_F(ModelOffload, ToDeviceFailsFastWhenTheWeightsAloneDoNotFit) {
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
  runtime(Device::cpu()).set_memory_capacity(1 << 20);  // 1 MiB: less than the four components' weights
  test::expect_error([&] { pipe.to(Device::cpu()); },
                     {"[memory] to(cpu:0)", "text_encoder ", "transformer ", "vae ", "capacity is 1.00 MiB",
                      "enable_model_cpu_offload()"});
  EXPECT_TRUE(pipe.offload_events().empty()) << "nothing was copied";
}

// Offload composes with every execution mode: weights move under the same executables (their
// buffers are relocated, so compiled callables see the same parameters and never recompile).
TEST_F(ModelOffload, EveryExecutionModeGivesTheSameImage) {
  const PipelineCallArgs args = test::fixture_call_args(kSet);
  PipelineOutput reference;
  {
    const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
    reference = pipe(args);
  }
  for (const std::string mode : {"eager", "defer", "compile blocks", "compile full"}) {
    FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
    pipe.enable_model_cpu_offload();
    CompileOptions o;
    o.fullgraph = true;
    if (mode == "compile blocks") pipe.transformer().compile_repeated_blocks(o);
    if (mode == "compile full") pipe.transformer().compile(o);
    EagerModeGuard guard(mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    const PipelineOutput first = pipe(args);
    const uint64_t compiles = compile_stats().compiles, traces = compile_stats().traces;
    const cpu::PrepackStats packs = cpu::prepack_stats();
    const PipelineOutput second = pipe(args);  // weights onloaded again, at new device addresses
    // Onloaded weights are not pre-packed: they would be packed again on every call.
    EXPECT_EQ(cpu::prepack_stats().packed, packs.packed) << mode;
    if (mode.starts_with("compile")) {
      EXPECT_GT(cpu::prepack_stats().skipped, packs.skipped) << mode;
    }
    EXPECT_EQ(first.image, reference.image) << mode;
    EXPECT_EQ(second.image, reference.image) << mode;
    EXPECT_EQ(compile_stats().compiles, compiles) << mode << ": offload must not recompile";
    EXPECT_EQ(compile_stats().traces, traces) << mode << ": offload must not retrace";
  }
}

// Compiled mode's pre-packed weights (devices/cpu/kernels/prepacked_weights.h) follow placement: weights
// placed on the device with to() are packed once and reused by later calls; weights model
// offload brings in for one call are not packed (they would be packed again on every call).
// Where oneDNN would read a pack with another kernel (other bits) nothing is packed, placed or
// not; the placed pipeline then counts skips instead (test_compiled.cc checks that AVX-512 packs).
TEST_F(ModelOffload, PlacedWeightsArePrepackedOnceOnloadedOnesNever) {
  const bool packs = cpu::linear_packing_keeps_bits(64, 64);
  const PipelineCallArgs args = test::fixture_call_args(kSet);
  CompileOptions o;
  o.fullgraph = true;
  FluxPipeline placed = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
  placed.to(Device::cpu());
  placed.transformer().compile(o);
  const size_t required = placed.estimate_memory(args).required;
  cpu::PrepackStats p0 = cpu::prepack_stats();
  const PipelineOutput first = placed(args);
  cpu::PrepackStats p1 = cpu::prepack_stats();
  EXPECT_EQ(p1.packed > p0.packed, packs);
  EXPECT_EQ(p1.skipped > p0.skipped, !packs);
  // The packs stay on the device: a later call's fail-fast plan counts them as taken.
  const size_t derived = runtime(Device::cpu()).memory().derived_bytes;
  EXPECT_GE(derived, p1.bytes - p0.bytes);
  EXPECT_EQ(placed.estimate_memory(args).required, required + derived);
  placed(args);
  cpu::PrepackStats p2 = cpu::prepack_stats();
  EXPECT_EQ(p2.packed, p1.packed) << "packed once, reused by the next call";
  EXPECT_EQ(p2.reused > p1.reused, packs);

  FluxPipeline offloaded = FluxPipeline::from_pretrained(test::pipeline_dir(kSet));
  offloaded.enable_model_cpu_offload();
  offloaded.transformer().compile(o);
  const PipelineOutput out = offloaded(args);
  cpu::PrepackStats p3 = cpu::prepack_stats();
  EXPECT_EQ(p3.packed, p2.packed);
  EXPECT_GT(p3.skipped, p2.skipped);
  EXPECT_EQ(out.image, first.image);
}

}  // namespace
}  // namespace kiln
