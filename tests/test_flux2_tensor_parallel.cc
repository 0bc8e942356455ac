// FLUX.2 tensor parallelism (spec flux2.md §3): Diffusers' plan for Flux2Transformer2DModel (packed
// colwise for the fused projections, the modulations gathered) and the text encoder sharded too.
// One process: what each rank reads (only its slices, exactly the bytes the plan gives it). Two
// ranks (CTest tensor_parallel_two_ranks, under mpirun -np 2): the sharded klein pipeline gives the
// single process's image, with CFG, in every mode.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "exec/compile.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "call_args.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/flux2/flux2_transformer.h"
#include "pipelines/flux2_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr const char* kKlein = "flux2_klein_tiny";

fs::path transformer_dir() { return test::pipeline_dir(kKlein) / "transformer"; }
TensorParallelConfig tp_for(std::shared_ptr<ProcessGroup> group) {
  return TensorParallelConfig{DeviceMesh(std::move(group))};
}

size_t bytes_of(const nn::NamedParameters& p) {
  size_t n = 0;
  for (const auto& [name, t] : p) n += size_t(t.numel()) * dtype_size(t.dtype());
  return n;
}

// Each rank reads exactly its share: the planned weights halved, everything else whole.
TEST(Flux2TensorParallelPlan, EachRankReadsOnlyItsSlices) {
  const Flux2Transformer2DModel whole = Flux2Transformer2DModel::from_pretrained(transformer_dir());
  const TensorParallelConfig probe = tp_for(ProcessGroup::detached(0, 2));
  const auto plan = ShardPlan::make(Flux2Transformer2DModel::tp_plan(whole.config(), probe.shard_modulation), probe.mesh);
  size_t expected = 0;
  for (const auto& [name, t] : whole.named_parameters()) {
    const size_t b = size_t(t.numel()) * dtype_size(t.dtype());
    const std::string module = name.substr(0, name.rfind('.'));
    expected += plan->find(module) ? b / 2 : b;
  }
  for (int rank = 0; rank < 2; ++rank) {
    io::reset_bytes_read();
    const Flux2Transformer2DModel shard =
        Flux2Transformer2DModel::from_pretrained(transformer_dir(), tp_for(ProcessGroup::detached(rank, 2)));
    EXPECT_EQ(bytes_of(shard.named_parameters()), expected) << "rank " << rank;
    EXPECT_EQ(io::bytes_read(), expected) << "rank " << rank << " reads only its slices";
  }
  std::printf("flux2_klein_tiny transformer: each rank holds %zu of %zu bytes\n", expected,
              bytes_of(whole.named_parameters()));
}

TEST(Flux2TensorParallelPlan, MeshesThatDoNotDivideAreRefusedBeforeLoading) {
  io::reset_bytes_read();
  test::expect_error(
      [] { Flux2Transformer2DModel::from_pretrained(transformer_dir(), tp_for(ProcessGroup::detached(0, 3))); },
      {"tp_degree (3)", "attention heads (2)"});
  EXPECT_EQ(io::bytes_read(), 0u);
}

// ---- two ranks ----

class TwoRanksFlux2 : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(ProcessGroup::world()->size(), 2)
        << "runs under mpirun -np 2 (CTest tensor_parallel_two_ranks); in one process add --gtest_filter=-TwoRanks*";
  }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// Transformer and text encoder sharded (heads 2 and 4 / KV heads 2: one, two and one per rank):
// the single process's latents within the TP tolerance (atol = rtol = 1e-3, spec §3.2), the
// image within one level, in strict eager, deferred and both compiled modes.
TEST_F(TwoRanksFlux2, TheShardedKleinPipelineGivesTheSingleProcessImage) {
  const PipelineCallArgs args = test::fixture_call_args(kKlein, "cfg");  // real CFG: two calls per step
  PipelineOptions options;
  options.text_encoder_out_layers = args.text_encoder_out_layers;
  const Flux2KleinPipeline one = Flux2KleinPipeline::from_pretrained(test::pipeline_dir(kKlein), options);
  const PipelineOutput single = one(args);
  const std::vector<float> want = to_vector(single.latents);
  double peak = 0;
  for (float v : want) peak = std::max(peak, double(std::fabs(v)));
  options.tensor_parallel = tp_for(ProcessGroup::world());
  for (const std::string mode : {"eager", "defer", "compile blocks", "compile full"}) {
    Flux2KleinPipeline pipe = Flux2KleinPipeline::from_pretrained(test::pipeline_dir(kKlein), options);
    CompileOptions o;
    o.fullgraph = true;
    if (mode == "compile blocks") pipe.compile_transformer(CompileScope::kRepeatedBlocks, o);
    if (mode == "compile full") pipe.compile_transformer(CompileScope::kFull, o);
    EagerModeGuard guard(mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
    const PipelineOutput out = pipe(args);
    EXPECT_LE(max_abs_diff(to_vector(out.latents), want), 1e-3 + 1e-3 * peak) << mode;
    EXPECT_LE(test::byte_diff(out.image, single.image).second, 1) << mode;
    if (mode != "eager") continue;
    for (const char* component : {"transformer", "text_encoder"}) {
      size_t rank_bytes = 0, all_bytes = 0;
      for (const auto& w : pipe.weight_bytes())
        if (w.component == component)
          for (const auto& [dt, b] : w.by_dtype) rank_bytes += b;
      for (const auto& w : one.weight_bytes())
        if (w.component == component)
          for (const auto& [dt, b] : w.by_dtype) all_bytes += b;
      std::printf("%s: klein %s weights %zu of %zu bytes (%.3f)\n", ProcessGroup::world()->describe().c_str(),
                  component, rank_bytes, all_bytes, double(rank_bytes) / double(all_bytes));
      EXPECT_LT(rank_bytes, all_bytes) << component << " is sharded";
    }
  }
}

}  // namespace
}  // namespace kiln
