// Tensor parallelism inside one PJRT program, as on a TPU: FLUX.1's transformer loaded as two
// tensor-parallel ranks (each reading only its slices), traced once per rank, lowered once for two
// replicas with its collectives as StableHLO's, and run in one execution on two devices of XLA's
// CPU plugin (each replica on its own rank's slices), gives the unsharded transformer's output.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include "devices/pjrt/pjrt_runtime.h"
#include "devices/pjrt/plugin.h"
#include "devices/pjrt/programs.h"
#include "distributed/local_ranks.h"
#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "exec/capture.h"
#include "exec/capture_observer.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "graph/graph.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/diffusion_pipeline.h"
#include "call_args.h"
#include "golden.h"
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

// ---- whole pipelines, one rank per device, the ranks as threads (generate --device pjrt --tp N) ----

// flux2_klein_tiny with heads every tensor-parallel degree up to 4 divides: the transformer's 2
// heads of 16 become 4 of 8 (RoPE axes halved, the q/k norm scales cut to 8: another model of
// the same widths, fine for comparing one device with several), and the text encoder's 2
// key/value heads become 4 by repeating each (the same function: query heads 0 and 1 still read
// the first one).
fs::path klein_with_four_heads(const fs::path& dir) {
  const fs::path from = test::pipeline_dir("flux2_klein_tiny");
  fs::copy(from, dir, fs::copy_options::recursive);
  const auto edit_json = [](const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(file));
    edit(j);
    std::ofstream(file) << j.dump(2);
  };
  edit_json(dir / "transformer" / "config.json", [](nlohmann::json& c) {
    c["num_attention_heads"] = 4;
    c["attention_head_dim"] = 8;
    c["axes_dims_rope"] = {2, 2, 2, 2};
  });
  edit_json(dir / "text_encoder" / "config.json", [](nlohmann::json& c) { c["num_key_value_heads"] = 4; });
  const auto rewrite = [](const fs::path& file, const std::function<Tensor(const std::string&, const Tensor&)>& edit) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    {
      const io::SafetensorsFile f(file);
      for (const std::string& name : f.names()) tensors.emplace_back(name, contiguous(edit(name, f.load(name))));
    }
    io::save_safetensors(file, tensors);
  };
  rewrite(dir / "transformer" / "diffusion_pytorch_model.safetensors", [](const std::string& name, const Tensor& t) {
    if (name.find("attn.norm_") == std::string::npos) return t;
    const std::vector<float> scale = to_vector(t);
    return from_vector(std::vector<float>(scale.begin(), scale.begin() + 8), {8});
  });
  rewrite(dir / "text_encoder" / "model.safetensors", [](const std::string& name, const Tensor& t) {
    if (name.find("k_proj.weight") == std::string::npos && name.find("v_proj.weight") == std::string::npos) return t;
    const std::vector<float> w = to_vector(t);  // [2 heads x 8, hidden]
    const int64_t hidden = t.shape()[1], head = 8 * hidden;
    std::vector<float> repeated;
    for (int64_t h : {0, 0, 1, 1}) repeated.insert(repeated.end(), w.begin() + h * head, w.begin() + (h + 1) * head);
    return from_vector(repeated, {32, hidden});
  });
  return dir;
}

struct RankRun {
  std::vector<uint8_t> image;
  size_t transformer_bytes = 0;  // the rank's transformer weights
  uint64_t bytes_read = 0;       // by the rank's thread, from the checkpoint files
  size_t device_weights = 0;     // its device's memory in use once the pipeline is placed there
  uint64_t joint_programs = 0;   // programs its device ran with the other ranks'
};

size_t component_bytes(const DiffusionPipeline& p, const std::string& component) {
  for (const auto& w : p.weight_bytes())
    if (w.component == component) {
      size_t n = 0;
      for (const auto& [dtype, bytes] : w.by_dtype) n += bytes;
      return n;
    }
  return 0;
}

// The pipeline at `dir` as `ranks` tensor-parallel ranks (1: unsharded) on pjrt:0..ranks-1,
// deferred or with the transformer compiled.
std::vector<RankRun> run_ranks(const fs::path& dir, const PipelineCallArgs& args, int ranks, bool compiled) {
  std::vector<RankRun> out(static_cast<size_t>(ranks));
  run_local_ranks(ranks, [&](int rank) {
    const EagerModeGuard deferred(EagerMode::DeferAndFuse);
    const Device device{DeviceType::pjrt, rank};
    PipelineOptions options;
    options.text_encoder_out_layers = args.text_encoder_out_layers;
    if (ranks > 1) options.tensor_parallel = TensorParallelConfig{DeviceMesh(ProcessGroup::world())};
    RankRun& r = out[size_t(rank)];
    const uint64_t read_before = io::bytes_read_by_this_thread();
    const size_t in_use_before = runtime(device).memory().in_use_bytes;
    const std::unique_ptr<DiffusionPipeline> p = DiffusionPipeline::from_pretrained(dir, options);
    p->to(device);
    r.bytes_read = io::bytes_read_by_this_thread() - read_before;
    r.device_weights = runtime(device).memory().in_use_bytes - in_use_before;
    r.transformer_bytes = component_bytes(*p, "transformer");
    if (compiled) p->compile_transformer(CompileScope::kFull);
    const uint64_t joint_before = runtime(device).device_counters().at("programs_run_with_other_ranks");
    r.image = (*p)(args).image;
    r.joint_programs = runtime(device).device_counters().at("programs_run_with_other_ranks") - joint_before;
  });
  return out;
}

class PjrtTensorParallelPipeline : public testing::TestWithParam<std::string> {};

TEST_P(PjrtTensorParallelPipeline, TwoAndFourDevicesGiveTheOneDeviceImage) {
  const std::string set = GetParam();
  const test::ScopedTempDir tmp("pjrt_tp_" + set);
  const fs::path dir = set == "flux2_klein_tiny" ? klein_with_four_heads(tmp.path() / "klein") : test::pipeline_dir(set);
  PipelineCallArgs args = test::fixture_call_args(set, set == "flux2_klein_tiny" ? "cfg" : "");
  args.seed = 0;
  const RankRun one = run_ranks(dir, args, 1, false).at(0);
  EXPECT_EQ(one.joint_programs, 0u);
  for (const int ranks : {2, 4})
    for (const bool compiled : {false, true}) {
      const std::string what = set + " on " + std::to_string(ranks) + " devices, " + (compiled ? "compiled" : "deferred");
      const std::vector<RankRun> runs = run_ranks(dir, args, ranks, compiled);
      const auto [differing, most] = test::byte_diff(runs[0].image, one.image);
      // The ranks sum their partial products in another order than one device's dot: f32
      // rounding moves a channel by at most one level.
      EXPECT_LE(most, 1) << what;
      std::printf("%s: %zu of %zu channels differ from one device's, by at most %d\n", what.c_str(), differing,
                  one.image.size(), most);
      for (int r = 0; r < ranks; ++r) {
        const RankRun& run = runs[size_t(r)];
        EXPECT_GT(run.joint_programs, 0u) << what << ", rank " << r << ": no program joined the other ranks";
        // Each rank holds and reads its slices of the transformer, not the whole of it.
        const double held = double(run.transformer_bytes) / double(one.transformer_bytes);
        const size_t saved = one.transformer_bytes - run.transformer_bytes;
        EXPECT_LE(held, 1.0 / ranks + 0.2) << what << ", rank " << r;
        EXPECT_LE(run.bytes_read, one.bytes_read - saved) << what << ", rank " << r;
        EXPECT_LE(run.device_weights, one.device_weights - saved) << what << ", rank " << r;
        if (r == 0)
          std::printf("  rank 0 of %d holds %.3f of the transformer; reads %llu of %llu bytes; pjrt:0 holds %zu of %zu\n",
                      ranks, held, static_cast<unsigned long long>(run.bytes_read),
                      static_cast<unsigned long long>(one.bytes_read), run.device_weights, one.device_weights);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PjrtTensorParallelPipeline,
                         testing::Values("flux1_tiny_arch", "sd35_tiny_arch", "flux2_klein_tiny"));

}  // namespace
}  // namespace kiln
