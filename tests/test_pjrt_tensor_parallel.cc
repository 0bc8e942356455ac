// Tensor parallelism inside one PJRT program, as on a TPU: FLUX.1's transformer loaded as two
// tensor-parallel ranks (each reading only its slices), traced once per rank, lowered once for two
// replicas with its collectives as StableHLO's, and run in one execution on two devices of XLA's
// CPU plugin (each replica on its own rank's slices), gives the unsharded transformer's output.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <optional>

#include "devices/pjrt/pjrt_runtime.h"
#include "devices/pjrt/plugin.h"
#include "devices/pjrt/programs.h"
#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "exec/capture.h"
#include "exec/capture_observer.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "graph/graph.h"
#include "models/flux/flux_transformer.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const fs::path kTransformer = fs::path(KILN_FIXTURES_DIR) / "flux1_tiny_arch" / "pipeline" / "transformer";

struct Step {
  Tensor hidden_states, encoder_hidden_states, pooled, timestep, img_ids, txt_ids;
};

Step make_step(const FluxTransformerConfig& c) {
  const int64_t l_img = 16, l_txt = 8;
  std::vector<float> img_ids, txt_ids(size_t(l_txt * 3), 0.f);
  for (int64_t i = 0; i < l_img; ++i) img_ids.insert(img_ids.end(), {0.f, float(i / 4), float(i % 4)});
  return Step{test::random_tensor({1, l_img, c.in_channels}, 1),
              test::random_tensor({1, l_txt, c.joint_attention_dim}, 2),
              test::random_tensor({1, c.pooled_projection_dim}, 3),
              from_vector({0.7f}, {1}),
              from_vector(img_ids, {l_img, 3}),
              from_vector(txt_ids, {l_txt, 3})};
}

// One rank's forward as the graph a whole-model compile traces, and the tensors its inputs are
// (the rank's slices, the step's inputs and RoPE tables). The traced call then runs on this
// process, a world of one rank, whose collectives refuse a graph recorded for two: that failure
// is expected, and only the trace is used.
detail::Captured trace(FluxTransformer2DModel& m, const Step& s) {
  m.compile();
  std::optional<detail::Captured> traced;
  const CaptureObserver keep([&](const std::string&, const detail::Captured& c) { traced = c; });
  try {
    (void)m.forward(s.hidden_states, s.encoder_hidden_states, s.pooled, s.timestep, s.img_ids, s.txt_ids);
    synchronize(Device::cpu());
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("recorded for a world of 2 ranks"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(traced.has_value());
  return *traced;
}

TEST(PjrtTensorParallel, TwoReplicasOfTheShardedTransformerGiveTheWholeOutput) {
  const FluxTransformer2DModel whole = FluxTransformer2DModel::from_pretrained(kTransformer);
  const Step step = make_step(whole.config());
  const std::vector<float> expected =
      to_vector(whole.forward(step.hidden_states, step.encoder_hidden_states, step.pooled, step.timestep,
                              step.img_ids, step.txt_ids));

  constexpr int kRanks = 2;
  std::vector<detail::Captured> ranks;
  for (int r = 0; r < kRanks; ++r) {
    FluxTransformer2DModel shard = FluxTransformer2DModel::from_pretrained(
        kTransformer, TensorParallelConfig{DeviceMesh(ProcessGroup::detached(r, kRanks))});
    ranks.push_back(trace(shard, step));
  }
  // Every rank traces the same program: only its arguments (its slices) differ.
  const auto program_of = [](const detail::Captured& c) {
    std::vector<size_t> bytes;
    std::vector<pjrt::ByteView> views;
    for (int i = 0; i < c.graph.num_inputs(); ++i) {
      const Shape& shape = c.graph.shape_of(i);
      bytes.push_back(size_t(numel(shape)) * dtype_size(c.graph.dtype_of(i)));
      views.push_back(pjrt::ByteView{i, 0, shape, contiguous_strides(shape), c.graph.dtype_of(i)});
    }
    return std::make_pair(bytes, pjrt::graph_program(c.graph, bytes, views, kRanks));
  };
  const auto [arg_bytes, text] = program_of(ranks[0]);
  ASSERT_EQ(program_of(ranks[1]).second, text);
  EXPECT_NE(text.find("\"stablehlo.all_reduce\""), std::string::npos);
  EXPECT_NE(text.find("\"stablehlo.all_gather\""), std::string::npos);

  const pjrt::Client client(pjrt::plugin_path());
  ASSERT_GE(client.device_count(), kRanks);
  const auto exe = client.compile("tp transformer", text, 0, kRanks);
  std::vector<std::vector<pjrt::DeviceBuffer>> held(kRanks);
  std::vector<std::vector<PJRT_Buffer*>> args(kRanks);
  std::vector<std::vector<Tensor>> dense(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    for (const Tensor& t : ranks[size_t(r)].inputs) {
      dense[size_t(r)].push_back(contiguous(t));
      wait(dense[size_t(r)].back());
      const auto [buffer, done] = client.upload(dense[size_t(r)].back().data_ptr(), dense[size_t(r)].back().nbytes(), r);
      client.await(done, "upload");
      held[size_t(r)].push_back(buffer);
      args[size_t(r)].push_back(buffer.get());
    }
    ASSERT_EQ(args[size_t(r)].size(), arg_bytes.size());
  }
  const auto outputs = client.execute_replicas(*exe, args);
  ASSERT_EQ(outputs.size(), size_t(kRanks));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(outputs[size_t(r)].size(), 1u);
    std::vector<float> got(expected.size());
    client.await(client.download(outputs[size_t(r)][0].get(), got.data(), 0, got.size() * sizeof(float)), "download");
    double worst = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, double(std::fabs(got[i] - expected[i])));
      scale = std::max(scale, double(std::fabs(expected[i])));
    }
    // f32 with the partial products summed in another order than one device's dot: rounding only.
    EXPECT_LE(worst, 1e-5 * std::max(1.0, scale)) << "replica " << r;
    std::printf("replica %d: largest difference from the unsharded transformer %.3g (of values up to %.3g)\n", r,
                worst, scale);
  }
}

}  // namespace
}  // namespace kiln
