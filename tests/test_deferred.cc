// Deferred-and-fused mode (exec/deferred.h): the same results as strict eager, fewer kernels,
// no buffers for fused intermediates, one compile per distinct step graph, errors at the call,
// and flushes counted by cause. (The per-op bit-equality harness is in test_ops.cc.)
#include <algorithm>
#include <cstring>
#include <thread>

#include "devices/runtime.h"
#include "exec/counters.h"
#include "exec/deferred.h"
#include "exec/dispatch.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "call_args.h"
#include "deterministic_weights.h"
#include "golden.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector(a), y = to_vector(b);
  return a.shape() == b.shape() && x.size() == y.size() &&
         std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

uint64_t flushes(FlushCause c) { return deferred_stats().flushes[int(c)]; }

// ---- FLUX.1 pipeline: identical output ----

class DeferredFluxPipeline : public testing::TestWithParam<std::string> {};

// Image exactly equal, latents bitwise equal (not merely within a tolerance): every fused kernel
// computes each element with eager's operations in eager's order.
TEST_P(DeferredFluxPipeline, ImageAndLatentsEqualStrictEagerBitwise) {
  const std::string set = GetParam();
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(set));
  PipelineCallArgs args = test::fixture_call_args(set);
  args.seed = 0;
  const PipelineOutput eager = pipe(args);
  reset_deferred_stats();
  PipelineOutput deferred;
  {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    deferred = pipe(args);
  }
  EXPECT_GT(deferred_stats().graphs_run, 0u);
  EXPECT_EQ(deferred.image, eager.image) << set;
  EXPECT_TRUE(same_bits(deferred.latents, eager.latents)) << set;
  // And both are Diffusers' image (within the 1-level rounding of test_flux_pipeline.cc).
  EXPECT_LE(test::byte_diff(deferred.image, test::golden_u8(set, "image.uint8")).second, 1) << set;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeferredFluxPipeline, testing::Values("flux1_tiny", "flux1_tiny_arch"));

// ---- the graph cache across denoising steps ----

// Per-step values (timestep, dt) are graph inputs, and the pipeline marks each step's end, so
// every step after the first builds the same graph: steps 2..N compile nothing, for any N, and
// a second image with another step count compiles nothing in its loop either.
TEST(DeferredMode, StepsAfterTheFirstCompileNothing) {
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  EagerModeGuard mode(EagerMode::DeferAndFuse);
  clear_graph_cache();
  for (int64_t steps : {4, 2, 7}) {
    PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
    args.num_inference_steps = steps;
    std::vector<uint64_t> misses, hits;  // cumulative, after each step
    args.on_step = [&](int64_t, int64_t, double) {
      misses.push_back(deferred_stats().cache_misses);
      hits.push_back(deferred_stats().cache_hits);
    };
    reset_deferred_stats();
    pipe(args);
    ASSERT_EQ(misses.size(), size_t(steps));
    for (int64_t i = 1; i < steps; ++i) {
      EXPECT_EQ(misses[size_t(i)], misses[0]) << steps << " steps: step " << i + 1 << " compiled a graph";
      EXPECT_GT(hits[size_t(i)], hits[size_t(i) - 1]) << steps << " steps: step " << i + 1 << " hit no cached graph";
    }
    EXPECT_EQ(flushes(FlushCause::step), uint64_t(steps) + 1);  // + the preparation before the loop
  }
}

// ---- fusion: fewer kernels, no buffer for any fused intermediate ----

struct StepCounts {
  uint64_t kernels = 0, kernels_run = 0, allocations = 0;
  GraphCacheEntryStats graph;  // deferred: the step's graph
  std::map<std::string, uint64_t> by_name;
  std::vector<float> out;
};

TEST(DeferredMode, TransformerStepFusesIntoFewerKernelsWithoutIntermediateBuffers) {
  const auto m = FluxTransformer2DModel::from_pretrained(test::pipeline_dir("flux1_tiny") / "transformer");
  const auto g = [](const std::string& k) { return test::golden("flux1_tiny", k); };
  // Inputs as a pipeline holds them: materialised once, the same tensors at every step.
  const Tensor x = g("transformer.step1.in.hidden_states"), ctx = g("transformer.in.encoder_hidden_states"),
               pooled = g("transformer.in.pooled_projections"), t = g("transformer.step1.in.timestep"),
               img_ids = g("transformer.in.img_ids"), txt_ids = g("transformer.in.txt_ids");
  auto measure = [&](EagerMode mode) {
    EagerModeGuard guard(mode);
    auto step = [&] { return m.forward(x, ctx, pooled, t, img_ids, txt_ids); };
    wait(step());  // first step: RoPE tables, graph compile
    StepCounts c;
    reset_counters();
    const uint64_t alloc0 = runtime(Device::cpu()).memory().allocations;
    c.out = to_vector(step());
    c.kernels = counters().kernels_launched;
    c.kernels_run = counters().kernels_run;
    c.allocations = runtime(Device::cpu()).memory().allocations - alloc0;
    c.by_name = kernels_by_name();
    if (mode == EagerMode::DeferAndFuse) c.graph = deferred_stats().entries.at(0);  // most recently used
    return c;
  };
  const StepCounts eager = measure(EagerMode::DeferNever);
  const StepCounts deferred = measure(EagerMode::DeferAndFuse);
  EXPECT_EQ(deferred.out, eager.out);
  const double ratio = double(deferred.kernels) / double(eager.kernels);
  std::printf("flux1_tiny transformer step: %llu kernels strict eager, %llu deferred (ratio %.3f); "
              "%llu / %llu buffers allocated\n",
              static_cast<unsigned long long>(eager.kernels), static_cast<unsigned long long>(deferred.kernels), ratio,
              static_cast<unsigned long long>(eager.allocations), static_cast<unsigned long long>(deferred.allocations));
  for (const auto& [name, n] : deferred.by_name) std::printf("  deferred %-24s %llu\n", name.c_str(), static_cast<unsigned long long>(n));
  EXPECT_LE(deferred.kernels * 3, eager.kernels) << "fusion must cut a FLUX step's launches to a third";
  // The per-block modulation projections of silu(temb) run as one grouped launch.
  EXPECT_EQ(deferred.by_name.at("grouped_linear"), 1u);
  // Elementwise ops never launch alone, and norms/linears absorb their epilogues.
  for (const char* op : {"add", "mul", "neg", "silu", "gelu_tanh", "copy", "cos", "sin", "exp", "div"})
    EXPECT_EQ(deferred.by_name.count(op), 0u) << op << " launched as its own kernel";
  EXPECT_GT(deferred.by_name.at("linear+epilogue"), 0u);
  EXPECT_GT(deferred.by_name.at("layer_norm+epilogue"), 0u);
  // Work items are not kernels: strict eager runs one per item; a deferred item runs one per op of
  // its chain and one for its fused pass ("linear+rms_norm+epilogue": three), a grouped GEMV one.
  EXPECT_EQ(eager.kernels_run, eager.kernels);
  uint64_t chain_kernels = 0;
  for (const auto& [name, n] : deferred.by_name)
    chain_kernels += n * uint64_t(1 + std::count(name.begin(), name.end(), '+'));
  EXPECT_EQ(deferred.kernels_run, chain_kernels);
  EXPECT_GT(deferred.kernels_run, deferred.kernels);
  // The step ran as one cached graph of N nodes and K launches. Both modes upload the same host
  // scalars; beyond those, strict eager allocates one buffer per kernel, and deferred mode
  // exactly the graph's launch outputs (fewer still: launches feeding a concat write into its
  // buffer). So no fused member and no producer that took an epilogue ever got a buffer.
  EXPECT_EQ(deferred.kernels, uint64_t(deferred.graph.launches));
  EXPECT_GT(deferred.graph.nodes, deferred.graph.launches);
  const uint64_t uploads = eager.allocations - eager.kernels;
  EXPECT_EQ(deferred.allocations, uint64_t(deferred.graph.buffers) + uploads);
  EXPECT_LE(deferred.graph.buffers, deferred.graph.launches);
  EXPECT_LT(deferred.allocations, eager.allocations);
}

TEST(DeferredMode, AFluxDevDepthStepLaunchesUnderAThirdOfStrictEagerKernels) {
  // FLUX.1 [dev]'s block structure (19 double + 38 single blocks, guidance embedding) at the
  // tiny fixture's widths, with generated weights: the ratio a real FLUX.1 step gets, where
  // the per-block launches dominate the fixed ones.
  const std::filesystem::path dir = test::pipeline_dir("flux1_tiny_arch") / "transformer";
  FluxTransformerConfig c = FluxTransformerConfig::from_json(io::JsonConfig(dir / "config.json"));
  c.num_layers = 19;
  c.num_single_layers = 38;
  c.guidance_embeds = true;
  std::map<std::string, Shape> shapes;
  const io::SafetensorsFile file(dir / "diffusion_pytorch_model.safetensors");
  for (const std::string& name : file.names()) {
    const Shape& shape = file.info(name).shape;
    auto replicate = [&](const std::string& prefix, int64_t count) {
      if (name.rfind(prefix + "0.", 0) != 0) return false;
      for (int64_t i = 0; i < count; ++i) shapes[prefix + std::to_string(i) + name.substr(prefix.size() + 1)] = shape;
      return true;
    };
    if (name.rfind("transformer_blocks.", 0) == 0 || name.rfind("single_transformer_blocks.", 0) == 0) {
      replicate("transformer_blocks.", c.num_layers);
      replicate("single_transformer_blocks.", c.num_single_layers);
      continue;
    }
    shapes[name] = shape;
    const std::string t = "time_text_embed.timestep_embedder.";
    if (name.rfind(t, 0) == 0) shapes["time_text_embed.guidance_embedder." + name.substr(t.size())] = shape;
  }
  const FluxTransformer2DModel m(c, nn::Weights(std::make_shared<test::GeneratedWeights>(shapes)));
  const int64_t L_img = 64, L_txt = 16;
  const Tensor x = test::random_tensor({1, L_img, c.in_channels}, 81);
  const Tensor ctx = test::random_tensor({1, L_txt, c.joint_attention_dim}, 82);
  const Tensor pooled = test::random_tensor({1, c.pooled_projection_dim}, 83);
  const Tensor t = from_vector(std::vector<float>{0.5f}, {1}), guidance = from_vector(std::vector<float>{3.5f}, {1});
  const Tensor img_ids = zeros({L_img, 3}), txt_ids = zeros({L_txt, 3});
  auto kernels = [&](EagerMode mode, std::vector<float>& out) {
    EagerModeGuard guard(mode);
    auto step = [&] { return m.forward(x, ctx, pooled, t, img_ids, txt_ids, guidance); };
    wait(step());  // RoPE tables, graph compile
    reset_counters();
    out = to_vector(step());
    return counters().kernels_launched;
  };
  std::vector<float> eager_out, deferred_out;
  const uint64_t eager = kernels(EagerMode::DeferNever, eager_out);
  const uint64_t deferred = kernels(EagerMode::DeferAndFuse, deferred_out);
  EXPECT_EQ(deferred_out, eager_out);
  std::printf("FLUX.1-dev depth (19 + 38 blocks) step: %llu kernels strict eager, %llu deferred (ratio %.3f)\n",
              static_cast<unsigned long long>(eager), static_cast<unsigned long long>(deferred),
              double(deferred) / double(eager));
  EXPECT_LE(deferred * 3, eager);
}

// Runs `f` in strict eager and in deferred mode; returns the deferred launch names.
template <typename F>
std::map<std::string, uint64_t> deferred_launches_equal_eager(F&& f) {
  const std::vector<float> eager = to_vector(f());
  EagerModeGuard defer(EagerMode::DeferAndFuse);
  reset_counters();
  const Tensor out = f();
  EXPECT_EQ(to_vector(out), eager);
  return kernels_by_name();
}

TEST(DeferredMode, ProducersWriteStraightIntoAConcat) {
  const Tensor x = test::random_tensor({1, 6, 8}, 11), y = test::random_tensor({1, 5, 8}, 12);
  const Tensor w = test::random_tensor({16, 8}, 13), nw = test::random_tensor({4}, 14);
  // concat along the sequence (B = 1): a linear + per-head RMSNorm chain, and a fused chain.
  const auto launches = deferred_launches_equal_eager([&] {
    const Tensor a = rms_norm(reshape(linear(x, w), {1, 6, 4, 4}), nw, 1e-6);
    const Tensor b = reshape(exp(linear(y, w)) * 2.0, {1, 5, 4, 4});
    return concat({a, b}, 1);
  });
  for (const auto& [name, n] : launches) EXPECT_EQ(name.find("concat"), std::string::npos) << name;
  EXPECT_EQ(launches.at("linear+rms_norm"), 1u);
  EXPECT_EQ(launches.count("rms_norm"), 0u);
}

TEST(DeferredMode, AttentionWritesStraightIntoItsTransposedCopy) {
  // [B,H,L,D] attention, then back to [B,L,H*D] as every DiT does: the transpose's copy is not a
  // launch; sdpa writes its rows at their [B,L,H,D] places. Also with B = 2 and a mask.
  for (const int64_t B : {1, 2}) {
    const Tensor q = test::random_tensor({B, 3, 7, 8}, 31), k = test::random_tensor({B, 3, 5, 8}, 32);
    const Tensor v = test::random_tensor({B, 3, 5, 8}, 33), mask = test::random_tensor({1, 1, 7, 5}, 34);
    const auto launches = deferred_launches_equal_eager([&] {
      const Tensor a = scaled_dot_product_attention(q * 2.0, k, v, Tensor(), 0.3);
      const Tensor b = scaled_dot_product_attention(q, k, v, mask, 0.5);
      return flatten(transpose(a, 1, 2), 2) + flatten(transpose(b, 1, 2), 2);
    });
    EXPECT_EQ(launches.at("sdpa"), 2u);
    EXPECT_EQ(launches.count("copy"), 0u);
    EXPECT_EQ(launches.at("fused_elementwise"), 2u) << "q * 2 and the sum; no copy of either attention";
  }
}

TEST(DeferredMode, RotaryEmbeddingRunsInTheLaunchOfEachPerHeadNorm) {
  // FLUX's joint attention: per-stream q = rms_norm(heads(linear(x))), concatenated along the
  // sequence, then RoPE (x * cos + pair-swapped x * sin). RoPE reads the norm's rows in place
  // inside each stream's launch: no concat, no RoPE launch. Also one stream alone (the single
  // blocks), and sizes whose RoPE runs over many threads' tiles.
  for (const auto& [txt, img, heads] : {std::tuple{5, 7, 2}, std::tuple{150, 600, 4}}) {
    const int64_t hd = 16, D = heads * hd, S = txt + img;
    const Tensor x = test::random_tensor({1, txt, D}, 41), y = test::random_tensor({1, img, D}, 42);
    const Tensor w1 = test::random_tensor({D, D}, 43), w2 = test::random_tensor({D, D}, 44);
    const Tensor nw = test::random_tensor({hd}, 45);
    std::vector<float> ids(size_t(S) * 3);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = float(i % 17);
    const nn::RotaryTables rope = nn::flux_pos_embed(from_vector(ids, {S, 3}), {4, 6, 6}, 10000.0);
    const Tensor one_ids = from_vector(std::vector<float>(ids.begin(), ids.begin() + img * 3), {img, 3});
    const nn::RotaryTables rope_img = nn::flux_pos_embed(one_ids, {4, 6, 6}, 10000.0);
    const auto launches = deferred_launches_equal_eager([&] {
      const Tensor q = concat({rms_norm(reshape(linear(x, w1), {1, txt, heads, hd}), nw, 1e-6),
                               rms_norm(reshape(linear(y, w2), {1, img, heads, hd}), nw, 1e-6)},
                              1);
      const Tensor single = rms_norm(reshape(linear(y, w1), {1, img, heads, hd}), nw, 1e-6);
      // Read by a non-elementwise op, as attention reads them.
      return concat({sum(nn::apply_rotary_emb(q, rope), {-1}), sum(nn::apply_rotary_emb(single, rope_img), {-1})},
                    1);
    });
    EXPECT_EQ(launches.at("linear+rms_norm+epilogue"), 3u);
    EXPECT_EQ(launches.at("sum"), 2u);
    EXPECT_EQ(launches.count("fused_elementwise"), 0u);
    EXPECT_EQ(launches.count("linear+rms_norm"), 0u);
  }
}

TEST(DeferredMode, TheTimestepSinusoidIsOneLaunchPerHalf) {
  // Diffusers' timestep embedding: exp(arange * c) (an index computation, fused), an outer
  // product through [N] -> [1,N] views, then cos and sin written into the two halves of a concat.
  // The small shared argument is recomputed in both halves' launches instead of materialised.
  for (const int64_t B : {1, 2}) {
    const Tensor t = test::random_tensor({B}, 50);
    for (const double start : {0.0, 3.0}) {
      const auto launches = deferred_launches_equal_eager([&] {
        const Tensor freqs = exp(arange(start, start + 64, 1, DType::f32, Device::cpu()) * -0.143);
        const Tensor arg = unsqueeze(t * 1000.0, 1) * unsqueeze(freqs, 0);
        return concat({cos(arg), sin(arg)}, 1);
      });
      EXPECT_EQ(launches.count("arange"), 0u);
      if (B == 1) {  // [1] -> [1,1] only adds a leading unit dim: t * 1000 joins both halves
        EXPECT_EQ(launches.at("fused_elementwise"), 2u);
        EXPECT_EQ(launches.size(), 1u);
      } else {  // [2] -> [2,1] changes how it broadcasts: t * 1000 is materialised, as is the concat
        EXPECT_EQ(launches.at("fused_elementwise"), 3u);
        EXPECT_EQ(launches.at("concat"), 1u);
      }
    }
  }
  // An arange broadcast along the inner dim of a large output (many tiles, many threads).
  const auto launches = deferred_launches_equal_eager([&] {
    return test::random_tensor({7, 5000}, 51) * arange(2.0, 5002.0, 1, DType::f32, Device::cpu()) + 0.5;
  });
  EXPECT_EQ(launches.at("fused_elementwise"), 1u);
  EXPECT_EQ(launches.size(), 1u);
}

TEST(DeferredMode, OnlySmallValuesAreRecomputedInEachReader) {
  // exp(x) read by two groups: recomputed in both when small, materialised once when large.
  for (const int64_t n : {64, 100000}) {
    const Tensor x = test::random_tensor({1, n}, 52), w = test::random_tensor({8, n}, 53);
    const auto launches = deferred_launches_equal_eager([&] {
      const Tensor e = exp(x);
      return concat({linear(e * 2.0, w), linear(e + 1.0, w)}, 1);
    });
    EXPECT_EQ(launches.at("fused_elementwise"), n == 64 ? 2u : 3u) << n;
  }
}

TEST(DeferredMode, RecomputedValuesRowSlicesAndSqueezesStayCorrect) {
  // Corner cases of the fusions above (each once produced a wrong result or an error).
  const Tensor a = test::random_tensor({64}, 71), x = test::random_tensor({1, 64}, 72);
  const Tensor w = test::random_tensor({64, 64}, 73), s = test::random_tensor({1, 64}, 74);
  const Tensor b = test::random_tensor({1, 64}, 75), w2 = test::random_tensor({32, 64}, 76);
  // A small value read by a view that feeds a linear: it must be materialised, not recomputed.
  deferred_launches_equal_eager([&] { return linear(reshape(a * 2.0, {1, 64}), w); });
  // A recomputed value (c) whose producer could have become one group's epilogue: the other
  // group still reads the producer.
  deferred_launches_equal_eager([&] {
    const Tensor c = linear(x, w) * s;
    return concat({c + b, c - b}, 0);
  });
  // A view dropping a leading unit dim, read by a fused op.
  deferred_launches_equal_eager([&] { return silu(reshape(linear(x, w), {64})) * 3.0; });
  // A concat along the last dim read reversed: no per-chain slicing across the reversed dim.
  deferred_launches_equal_eager([&] { return flip(concat({linear(x, w2), linear(b, w2)}, -1), 1) * s; });
}

TEST(DeferredMode, SingleRowLinearsReadingOneRowAreOneGroupedLaunch) {
  // A DiT's modulation projections: silu(temb) [1, D] through one linear per block (with and
  // without bias, f32 and bf16 weights). Not grouped: a linear of several rows, and a linear
  // whose weight is computed after the group's first linear would run.
  const Tensor temb = test::random_tensor({1, 24}, 61), rows = test::random_tensor({3, 24}, 62);
  const Tensor w1 = test::random_tensor({48, 24}, 63), w2 = cast(test::random_tensor({20, 24}, 64), DType::bf16);
  const Tensor w3 = test::random_tensor({72, 24}, 65), b1 = test::random_tensor({48}, 66);
  const Tensor b3 = test::random_tensor({72}, 67);
  const auto launches = deferred_launches_equal_eager([&] {
    const Tensor t = silu(temb);
    const Tensor a = linear(t, w1, b1), b = linear(t, w2), c = linear(t, w3, b3);
    const Tensor late = linear(t, exp(w1));  // its weight is computed after `a` would run
    const Tensor many = linear(rows, w1, b1);
    return concat({sum(a, {-1}) + sum(b, {-1}) + sum(c, {-1}) + sum(late, {-1}), sum(many, {-1})}, 0);
  });
  EXPECT_EQ(launches.at("grouped_linear"), 1u);
  EXPECT_EQ(launches.at("linear"), 2u) << "the 3-row linear and the one whose weight comes later";
}

TEST(DeferredMode, NestedConcatsAreWrittenCompletely) {
  const Tensor x = test::random_tensor({1, 3, 8}, 17), w = test::random_tensor({8, 8}, 18);
  const Tensor w2 = test::random_tensor({8, 8}, 20), w3 = test::random_tensor({8, 8}, 23);
  const auto launches = deferred_launches_equal_eager([&] {
    const Tensor a = linear(x, w), b = exp(linear(x, w2)), c = linear(x, w3) * 3.0;
    return concat({concat({a, b}, 1), c}, 1);
  });
  EXPECT_EQ(launches.at("concat"), 1u);  // the inner one writes into the outer one's buffer
}

// A same-dtype cast recorded directly (the op API skips it) of a strided input, viewed again:
// the cast is kept, since views of its result assume a dense layout.
TEST(DeferredMode, ViewOfANoOpCastOfAStridedInput) {
  const Tensor x = transpose(test::random_tensor({4, 6}, 19), 0, 1);
  deferred_launches_equal_eager([&] {
    const Tensor y = dispatch("cast", {x}, Attrs{{"dtype", int64_t(DType::f32)}});
    return slice(y, 1, 1, 3) + 1.0;
  });
}

TEST(DeferredMode, ConcatOfAdjacentSlicesOfOneValueLaunchesNothing) {
  const Tensor x = test::random_tensor({1, 7, 8}, 15), w = test::random_tensor({8, 8}, 16);
  const auto launches = deferred_launches_equal_eager([&] {
    const Tensor h = linear(x, w);
    return linear(concat({slice(h, 1, 0, 3), slice(h, 1, 3, 7)}, 1), w);
  });
  for (const auto& [name, n] : launches) EXPECT_EQ(name.find("concat"), std::string::npos) << name;
  EXPECT_EQ(launches.at("linear"), 2u);
}

// ---- errors at the call, flush causes ----

TEST(DeferredMode, ShapeErrorsRaiseAtTheRecordingCall) {
  EagerModeGuard mode(EagerMode::DeferAndFuse);
  const Tensor a = test::random_tensor({2, 3}, 1) * 2.0;  // pending
  const Tensor b = test::random_tensor({4, 5}, 2) + 1.0;  // pending
  ASSERT_TRUE(a.is_pending());
  reset_deferred_stats();
  const size_t pending = pending_nodes();
  test::expect_error([&] { add(a, b); }, {"[add]", "[2,3]", "[4,5]"});
  test::expect_error([&] { matmul(a, b); }, {"[matmul]"});
  EXPECT_EQ(deferred_stats().flushes_total(), 0u);  // raised while recording: nothing ran
  EXPECT_EQ(pending_nodes(), pending);
  EXPECT_EQ(a.shape(), (Shape{2, 3}));  // metadata never needs a flush
  EXPECT_TRUE(a.is_pending());
}

TEST(DeferredMode, EachFlushIsCountedByCause) {
  EagerModeGuard mode(EagerMode::DeferAndFuse);
  kiln::sync();  // nothing left over from other tests on this thread
  reset_deferred_stats();
  const Tensor x = test::random_tensor({8, 8}, 3);
  // A host read flushes only what the read value needs.
  const Tensor a = exp(x) * 2.0, unrelated = x + 5.0;
  EXPECT_EQ(to_vector(a).size(), 64u);
  EXPECT_EQ(flushes(FlushCause::host_read), 1u);
  EXPECT_TRUE(unrelated.is_pending());
  EXPECT_EQ(pending_nodes(), 1u);
  mark_step();
  EXPECT_EQ(flushes(FlushCause::step), 1u);
  EXPECT_FALSE(unrelated.is_pending());
  const Tensor y = unrelated * 3.0;
  kiln::sync();
  EXPECT_EQ(flushes(FlushCause::sync), 1u);
  EXPECT_FALSE(y.is_pending());
  Tensor z = y - 1.0;
  {
    EagerModeGuard eager(EagerMode::DeferNever);
    const Tensor w = z + 1.0;  // strict eager: pending work runs first
    EXPECT_EQ(flushes(FlushCause::mode_switch), 1u);
    EXPECT_FALSE(z.is_pending());
    EXPECT_FALSE(w.is_pending());
  }
  // Limits: graph size, and bytes of pending values user code still holds.
  const DeferLimits saved = defer_limits();
  DeferLimits small = saved;
  small.max_nodes = 10;
  set_defer_limits(small);
  for (int i = 0; i < 25; ++i) z = z + 1.0;
  EXPECT_EQ(flushes(FlushCause::size_limit), 2u);
  small = saved;
  small.max_live_bytes = 64 * 4 * 10;
  set_defer_limits(small);
  std::vector<Tensor> held;
  for (int i = 0; i < 128; ++i) held.push_back(x * double(i));
  set_defer_limits(saved);
  EXPECT_GE(flushes(FlushCause::memory_limit), 1u);
  const std::vector<float> want = to_vector(x * 127.0);
  EXPECT_EQ(to_vector(held.back()), want);
}

// A host read runs only what the read value needs; later nodes that read the flushed values
// (directly and through views) stay pending and see the computed values.
TEST(DeferredMode, PartialFlushKeepsTheRestPendingAndConsistent) {
  const Tensor x = test::random_tensor({4, 6}, 21);
  const auto compute = [&](bool read_early) {
    const Tensor a = exp(x) * 0.5;
    const Tensor b = transpose(a, 0, 1) + 1.0;  // reads a through a view
    const Tensor c = slice(a, 1, 2, 5) * b.dim(0);
    const Tensor d = sigmoid(x) - 2.0;           // independent
    if (read_early) {
      EXPECT_EQ(to_vector(a).size(), 24u);  // flushes exp and mul only
      EXPECT_TRUE(b.is_pending());
      EXPECT_TRUE(c.is_pending());
      EXPECT_TRUE(d.is_pending());
    }
    std::vector<float> all = to_vector(b), more = to_vector(c), last = to_vector(d);
    all.insert(all.end(), more.begin(), more.end());
    all.insert(all.end(), last.begin(), last.end());
    return all;
  };
  const std::vector<float> eager = compute(false);
  EagerModeGuard defer(EagerMode::DeferAndFuse);
  kiln::sync();
  EXPECT_EQ(compute(true), eager);
  EXPECT_EQ(compute(false), eager);
}

// A flush that fails (here: the device's memory capacity) raises at the flush, and values of
// the failed graph say so when read, instead of crashing or returning garbage.
TEST(DeferredMode, AFailedFlushReportsItsValuesAsLost) {
  DeviceRuntime& rt = runtime(Device::cpu());
  const Tensor x = test::random_tensor({256, 256}, 22);
  EagerModeGuard defer(EagerMode::DeferAndFuse);
  kiln::sync();
  const Tensor a = x * 2.0, b = a + 1.0;
  const size_t capacity = rt.memory().capacity_bytes;
  rt.set_memory_capacity(rt.memory().in_use_bytes + 1024);  // nothing of 256 KiB fits
  test::expect_error([&] { to_vector(b); }, {"[alloc]"});
  rt.set_memory_capacity(capacity);
  test::expect_error([&] { to_vector(a); }, {"[defer]", "dropped"});
  const Tensor again = x * 2.0;  // the recorder works again
  EXPECT_EQ(to_vector(again)[0], to_vector(x)[0] * 2.0f);
}

TEST(DeferredMode, ModeIsScopedPerThreadAndRestoredOnExceptions) {
  const EagerMode before = eager_mode();
  EagerModeGuard outer(EagerMode::DeferNever);
  try {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    EXPECT_EQ(eager_mode(), EagerMode::DeferAndFuse);
    std::thread([&] { EXPECT_EQ(eager_mode(), before); }).join();  // other threads keep the default
    throw Error("boom");
  } catch (const Error&) {
  }
  EXPECT_EQ(eager_mode(), EagerMode::DeferNever);
  EXPECT_STREQ(eager_mode_name(EagerMode::DeferAndFuse), "defer");
}

TEST(DeferredMode, PendingValuesBelongToTheirThread) {
  EagerModeGuard mode(EagerMode::DeferAndFuse);
  const Tensor a = test::random_tensor({4}, 5) * 2.0;
  ASSERT_TRUE(a.is_pending());
  std::string error;
  std::thread([&] {
    try {
      to_vector(a);
    } catch (const Error& e) {
      error = e.what();
    }
  }).join();
  EXPECT_NE(error.find("another thread"), std::string::npos) << error;
  kiln::sync();
  std::thread([&] { EXPECT_EQ(to_vector(a).size(), 4u); }).join();  // fine once flushed
  // A value still pending when its thread exits is lost, and says so when read.
  Tensor orphan;
  std::thread([&] {
    EagerModeGuard mode(EagerMode::DeferAndFuse);
    orphan = test::random_tensor({4}, 7) * 3.0;
  }).join();
  test::expect_error([&] { to_vector(orphan); }, {"[defer]", "dropped"});
}

// The graph cache key ignores host scalar values: y = x * s + t for different s, t is one graph.
TEST(DeferredMode, HostScalarsAreRuntimeParameters) {
  EagerModeGuard mode(EagerMode::DeferAndFuse);
  clear_graph_cache();
  reset_deferred_stats();
  const Tensor x = test::random_tensor({16}, 6);
  for (int i = 0; i < 5; ++i) {
    const Tensor y = x * (0.5 + i) + (1.0 - i);
    const std::vector<float> got = to_vector(y), xs = to_vector(x);
    EXPECT_FLOAT_EQ(got[3], float(xs[3] * float(0.5 + i) + float(1.0 - i)));
  }
  EXPECT_EQ(deferred_stats().cache_misses, 1u);
  EXPECT_EQ(deferred_stats().cache_hits, 4u);
}

}  // namespace
}  // namespace kiln
