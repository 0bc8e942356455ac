// Compiled mode (exec/compile.h): the same results as strict eager, executables cached by
// signature (shapes/dtypes, never values or step counts), one executable per repeated block
// class, a persistent cache a second process loads instead of compiling, graph breaks named,
// weights as runtime arguments, and one planned arena for the intermediates. (The per-op
// bit-equality harness is in test_ops.cc.)
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include <oneapi/dnnl/dnnl.hpp>

#include "devices/cpu/kernels/linear_gemm.h"
#include "devices/cpu/kernels/prepacked_weights.h"
#include "devices/runtime.h"
#include "exec/capture.h"
#include "exec/compile.h"
#include "exec/executable_store.h"
#include "exec/graph_executor.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "call_args.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

bool same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector(a), y = to_vector(b);
  return a.shape() == b.shape() && x.size() == y.size() &&
         std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// Every test starts with empty process caches, fresh counters and its own persistent cache
// directory (or none), and leaves persistence off as the test environment has it.
class CompiledMode : public testing::Test {
 protected:
  void SetUp() override {
    clear_executable_cache();
    reset_compile_stats();
    set_executable_cache_dir({});
  }
  void TearDown() override {
    set_executable_cache_dir({});
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  // A fresh persistent cache directory for this test.
  fs::path use_persistent_cache() {
    dir_ = fs::temp_directory_path() /
           ("kiln_compile_cache_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::remove_all(dir_);
    set_executable_cache_dir(dir_);
    return dir_;
  }
  fs::path dir_;
};

CompileOptions fullgraph() {
  CompileOptions o;
  o.fullgraph = true;
  return o;
}

// ---- FLUX.1 pipeline: identical output ----

struct PipelineCase {
  std::string set, how;  // how: "full" (transformer.compile) or "blocks" (compile_repeated_blocks)
};

class CompiledFluxPipeline : public testing::TestWithParam<PipelineCase> {
 protected:
  void SetUp() override {
    clear_executable_cache();
    reset_compile_stats();
    set_executable_cache_dir({});
  }
};

// Image exactly equal, latents bitwise equal: the executable runs deferred mode's fused kernels,
// which compute every element as strict eager does; the arena only moves where values live.
TEST_P(CompiledFluxPipeline, ImageAndLatentsEqualStrictEagerBitwise) {
  const auto [set, how] = GetParam();
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(set));
  PipelineCallArgs args = test::fixture_call_args(set);
  args.seed = 0;
  const PipelineOutput eager = pipe(args);
  if (how == "full") pipe.transformer().compile(fullgraph());
  else pipe.transformer().compile_repeated_blocks(fullgraph());
  const PipelineOutput compiled = pipe(args);
  EXPECT_EQ(compile_stats().calls, uint64_t(args.num_inference_steps) *
                                       (how == "full" ? 1 : pipe.transformer().transformer_blocks().size() +
                                                                pipe.transformer().single_transformer_blocks().size()));
  EXPECT_EQ(compile_stats().eager_fallbacks, 0u);
  EXPECT_EQ(compiled.image, eager.image) << set << " " << how;
  EXPECT_TRUE(same_bits(compiled.latents, eager.latents)) << set << " " << how;
  EXPECT_LE(test::byte_diff(compiled.image, test::golden_u8(set, "image.uint8")).second, 1) << set;
  // Regional compile with deferred mode around the blocks (what Diffusers' TPU guide recommends).
  if (how == "blocks") {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    const PipelineOutput mixed = pipe(args);
    EXPECT_EQ(mixed.image, eager.image) << set;
    EXPECT_TRUE(same_bits(mixed.latents, eager.latents)) << set;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CompiledFluxPipeline,
                         testing::Values(PipelineCase{"flux1_tiny", "full"}, PipelineCase{"flux1_tiny", "blocks"},
                                         PipelineCase{"flux1_tiny_arch", "full"},
                                         PipelineCase{"flux1_tiny_arch", "blocks"}),
                         [](const auto& info) { return info.param.set + "_" + info.param.how; });

// ---- what compiles, and what does not ----

// Counters after one pipeline call: {traces, compiles}.
std::pair<uint64_t, uint64_t> traces_and_compiles_of(const FluxPipeline& pipe, const PipelineCallArgs& args) {
  const CompileStats before = compile_stats();
  pipe(args);
  const CompileStats after = compile_stats();
  return {after.traces - before.traces, after.compiles - before.compiles};
}

TEST_F(CompiledMode, TheWholeTransformerCompilesOncePerImageSize) {
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  pipe.transformer().compile(fullgraph());
  const PipelineCallArgs base = test::fixture_call_args("flux1_tiny_arch");
  using Pair = std::pair<uint64_t, uint64_t>;
  EXPECT_EQ(traces_and_compiles_of(pipe, base), Pair(1, 1)) << "first call";
  EXPECT_EQ(traces_and_compiles_of(pipe, base), Pair(0, 0)) << "same shapes again";
  for (int64_t steps : {2, 7}) {
    PipelineCallArgs a = base;
    a.num_inference_steps = steps;
    EXPECT_EQ(traces_and_compiles_of(pipe, a), Pair(0, 0)) << steps << " steps";
  }
  PipelineCallArgs other = base;
  other.seed = 7;
  other.prompt = "another prompt, same padded length";
  other.guidance_scale = 1.0;
  EXPECT_EQ(traces_and_compiles_of(pipe, other), Pair(0, 0)) << "seed, prompt text and guidance are values";
  PipelineCallArgs bigger = base;
  bigger.width = *base.width * 2;
  EXPECT_EQ(traces_and_compiles_of(pipe, bigger), Pair(1, 1)) << "a new width";
  EXPECT_EQ(traces_and_compiles_of(pipe, bigger), Pair(0, 0)) << "that width again";
  EXPECT_EQ(traces_and_compiles_of(pipe, base), Pair(0, 0)) << "back to the first size";
  // Each compile is reported with its reason.
  const CompileStats s = compile_stats();
  ASSERT_EQ(s.events.size(), 2u);
  EXPECT_EQ(s.events[0].reason, "first call");
  EXPECT_NE(s.events[1].reason.find("hidden_states"), std::string::npos) << s.events[1].reason;
  EXPECT_EQ(s.events[1].source, "compiled");
  EXPECT_EQ(pipe.transformer().is_compiled(), true);
}

TEST_F(CompiledMode, RepeatedBlocksCompileOneExecutablePerBlockClass) {
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  const FluxTransformer2DModel& t = pipe.transformer();
  ASSERT_EQ(t.transformer_blocks().size(), 2u);  // so sharing is visible
  ASSERT_EQ(t.single_transformer_blocks().size(), 2u);
  pipe.transformer().compile_repeated_blocks(fullgraph());
  const PipelineCallArgs base = test::fixture_call_args("flux1_tiny_arch");
  pipe(base);
  CompileStats s = compile_stats();
  EXPECT_EQ(s.compiles, 2u) << "one executable per block class";
  EXPECT_EQ(s.traces, 4u) << "each block traced once";
  EXPECT_EQ(s.shared_hits, 2u) << "the second block of each class reuses the first's executable";
  for (const auto& b : t.transformer_blocks()) EXPECT_EQ(b.compiled()->signatures(), 1u);
  PipelineCallArgs more = base;
  more.num_inference_steps = 3;
  EXPECT_EQ(traces_and_compiles_of(pipe, more), (std::pair<uint64_t, uint64_t>(0, 0)));
  PipelineCallArgs taller = base;
  taller.height = *base.height * 2;
  EXPECT_EQ(traces_and_compiles_of(pipe, taller), (std::pair<uint64_t, uint64_t>(4, 2))) << "a new height";
}

TEST_F(CompiledMode, RegionalCompileNeedsRepeatedBlocks) {
  FluxTransformerConfig c;
  c.num_layers = 0;
  c.num_single_layers = 0;
  c.attention_head_dim = 8;
  c.axes_dims_rope = {2, 2, 4};
  c.num_attention_heads = 2;
  c.joint_attention_dim = 8;
  c.pooled_projection_dim = 8;
  c.in_channels = 4;
  // A checkpoint with just the non-block weights, made on the fly.
  const fs::path file = fs::temp_directory_path() / ("kiln_noblocks_" + std::to_string(::getpid()) + ".safetensors");
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto add = [&](const std::string& name, const Shape& s) { tensors.emplace_back(name, zeros(s)); };
  const int64_t D = 16;
  add("x_embedder.weight", {D, 4});
  add("x_embedder.bias", {D});
  add("context_embedder.weight", {D, 8});
  add("context_embedder.bias", {D});
  for (const char* m : {"timestep_embedder", "text_embedder"}) {
    add(std::string("time_text_embed.") + m + ".linear_1.weight", {D, std::string(m) == "text_embedder" ? 8 : 256});
    add(std::string("time_text_embed.") + m + ".linear_1.bias", {D});
    add(std::string("time_text_embed.") + m + ".linear_2.weight", {D, D});
    add(std::string("time_text_embed.") + m + ".linear_2.bias", {D});
  }
  add("norm_out.linear.weight", {2 * D, D});
  add("norm_out.linear.bias", {2 * D});
  add("proj_out.weight", {4, D});
  add("proj_out.bias", {4});
  synchronize(Device::cpu());
  io::save_safetensors(file, tensors);
  FluxTransformer2DModel model(c, nn::Weights(file));
  try {
    model.compile_repeated_blocks();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("regional compilation failed"), std::string::npos) << e.what();
  }
  fs::remove(file);
}

// ---- the persistent cache ----

TEST_F(CompiledMode, AWarmPersistentCacheIsLoadedInsteadOfCompiled) {
  const fs::path dir = use_persistent_cache();
  const PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
  PipelineOutput first;
  {
    FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
    pipe.transformer().compile_repeated_blocks(fullgraph());
    first = pipe(args);
  }
  EXPECT_EQ(compile_stats().compiles, 2u);
  EXPECT_EQ(compile_stats().disk_writes, 2u);
  // A "second process": nothing in memory, new callables; only the directory is shared.
  clear_executable_cache();
  reset_compile_stats();
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir("flux1_tiny_arch"));
  pipe.transformer().compile_repeated_blocks(fullgraph());
  const PipelineOutput second = pipe(args);
  EXPECT_EQ(compile_stats().compiles, 0u);
  EXPECT_EQ(compile_stats().disk_hits, 2u);
  EXPECT_EQ(compile_stats().disk_rejects, 0u);
  EXPECT_EQ(second.image, first.image);
  EXPECT_TRUE(same_bits(second.latents, first.latents));
}

TEST_F(CompiledMode, CorruptCacheEntriesAreIgnoredAndReplaced) {
  const fs::path dir = use_persistent_cache();
  const Tensor x = from_vector(test::random_values(64, 3), {8, 8});
  const Tensor w = from_vector(test::random_values(64, 4), {8, 8});
  auto fn = [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{gelu(linear(a[0], w) * 2.0 + 1.0)}; };
  const Tensor want = fn({x})[0];
  { CompiledFunction("toy", fn, {})({x}, {w}); }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const auto damage = [&](const std::string& how) {
    std::ifstream in(files[0], std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    if (how == "truncated") bytes.resize(bytes.size() / 2);
    else bytes[bytes.size() - 10] ^= 0x5a;  // a flipped byte in the body
    std::ofstream(files[0], std::ios::binary | std::ios::trunc) << bytes;
  };
  for (const std::string how : {"truncated", "flipped"}) {
    damage(how);
    clear_executable_cache();
    reset_compile_stats();
    testing::internal::CaptureStderr();
    const Tensor got = CompiledFunction("toy", fn, {})({x}, {w})[0];
    const std::string err = testing::internal::GetCapturedStderr();
    EXPECT_EQ(compile_stats().disk_rejects, 1u) << how;
    EXPECT_EQ(compile_stats().compiles, 1u) << how;
    EXPECT_NE(err.find("ignoring compile cache entry"), std::string::npos) << how << ": " << err;
    EXPECT_TRUE(same_bits(got, want)) << how;
    // The recompiled entry replaced it: the next process loads it.
    clear_executable_cache();
    reset_compile_stats();
    CompiledFunction("toy", fn, {})({x}, {w});
    EXPECT_EQ(compile_stats().disk_hits, 1u) << how;
  }
}

// An entry with a valid checksum whose launches do not fit its graph (tampered, or written by
// a buggy engine) is rejected by validation, never run.
TEST_F(CompiledMode, AnEntryWhoseLaunchesDoNotFitItsGraphIsRejected) {
  const Tensor x = from_vector(test::random_values(64, 3), {8, 8});
  const Tensor w = from_vector(test::random_values(64, 4), {8, 8});
  const Tensor row = from_vector(test::random_values(8, 5), {1, 8});
  const Tensor w2 = from_vector(test::random_values(32, 6), {4, 8});
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  struct Case {
    Fn fn;
    std::vector<Tensor> args, params;
    std::vector<std::pair<std::string, std::string>> tamper;
  };
  const std::vector<Case> cases = {
      {[&](const std::vector<Tensor>& a) { return std::vector<Tensor>{gelu(linear(a[0], w) * 2.0 + 1.0)}; },
       {x},
       {w},
       {
           {"\"alias_base\":-1", "\"alias_base\":999"},  // out of range
           {"\"kind\":3", "\"kind\":5"},                // the linear+epilogue launch turned into an alias of nothing
           {"\"into\":-1", "\"into\":0"},                // writing "into" a graph input
           {"\"into_strides\":[]", "\"into_strides\":[1]"},  // strides without a buffer to write into
           {"\"slice\":[-1,0,0]", "\"slice\":[0,0,8]"},      // rows of a consumer it does not write
       }},
      // Two single-row linears of one row: one grouped launch.
      {[&](const std::vector<Tensor>& a) {
         return std::vector<Tensor>{concat({linear(a[0], w), linear(a[0], w2)}, 1) * 3.0};
       },
       {row},
       {w, w2},
       {
           {"\"batch\":[", "\"batch\":[0,"},  // a graph input "computed" by the grouped launch
           {"\"kind\":6", "\"kind\":1"},      // the batched linear turned into its own launch... of nothing new
       }},
      // Attention writing its transposed copy ([1,2,4,8] into [1,4,2,8]: strides [0,8,16,1]).
      {[&](const std::vector<Tensor>& a) {
         const Tensor q = reshape(a[0], {1, 2, 4, 8});
         return std::vector<Tensor>{flatten(transpose(scaled_dot_product_attention(q, q, q, Tensor(), 0.5), 1, 2), 2) *
                                    2.0};
       },
       {x},
       {},
       {
           {"\"into_strides\":[0,8,16,1]", "\"into_strides\":[0,8,8,1]"},   // two heads on one place
           {"\"into_strides\":[0,8,16,1]", "\"into_strides\":[0,8,32,1]"},  // past the copy's end
       }},
  };
  for (const Case& c : cases) {
    const fs::path dir = use_persistent_cache();
    { CompiledFunction("toy", c.fn, {})(c.args, c.params); }
    fs::path file;
    for (const auto& e : fs::directory_iterator(dir)) file = e.path();
    std::ifstream in(file);
    std::string header, body;
    std::getline(in, header);
    std::getline(in, body, '\0');
    in.close();
    const auto fnv = [](const std::string& t) {
      uint64_t h = 1469598103934665603ull;
      for (unsigned char ch : t) h = (h ^ ch) * 1099511628211ull;
      char buf[17];
      std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
      return std::string(buf);
    };
    ASSERT_EQ(header, fnv(body)) << "the store's checksum format changed";
    for (const auto& [from, to] : c.tamper) {
      std::string bad = body;
      const size_t at = bad.find(from);
      ASSERT_NE(at, std::string::npos) << from << " in " << body;
      bad.replace(at, from.size(), to);
      std::ofstream(file, std::ios::trunc) << fnv(bad) << '\n' << bad;
      clear_executable_cache();
      reset_compile_stats();
      testing::internal::CaptureStderr();
      const Tensor got = CompiledFunction("toy", c.fn, {})(c.args, c.params)[0];
      const std::string err = testing::internal::GetCapturedStderr();
      EXPECT_EQ(compile_stats().disk_rejects, 1u) << to;
      EXPECT_NE(err.find("[compile-cache]"), std::string::npos) << to << ": " << err;
      EXPECT_TRUE(same_bits(got, c.fn(c.args)[0])) << to;
    }
    fs::remove_all(dir);
  }
}

// ---- capture rules ----

TEST_F(CompiledMode, AGraphBreakUnderFullgraphNamesTheOpAndTheModule) {
  const Tensor x = from_vector({1, 2, 3, 4}, {4});
  auto fn = [](const std::vector<Tensor>& a) {
    ModuleScope block("blocks", 1);
    const Tensor y = a[0] * 2.0;
    const float first = to_vector(y)[0];  // a host read inside forward
    return std::vector<Tensor>{y + double(first)};
  };
  try {
    CompiledFunction("toy_model", fn, fullgraph())({x}, {});
    FAIL() << "expected a graph break";
  } catch (const GraphBreak& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("toy_model"), std::string::npos) << m;
    EXPECT_NE(m.find("blocks.1"), std::string::npos) << m;
    EXPECT_NE(m.find("'mul'"), std::string::npos) << m;
  }
  EXPECT_EQ(compile_stats().compiles, 0u);
  // Without fullgraph the signature runs eagerly, with the break recorded once.
  const CompiledFunction lenient("toy_model", fn, CompileOptions{});
  for (int i = 0; i < 2; ++i) EXPECT_EQ(to_vector(lenient({x}, {})[0]), (std::vector<float>{4, 6, 8, 10}));
  EXPECT_EQ(compile_stats().graph_breaks, 1u);
  EXPECT_EQ(compile_stats().eager_fallbacks, 2u);
  EXPECT_EQ(compile_stats().traces, 1u);
}

// Reading an input's value on the host inside forward would bake one call's value into the
// graph: a graph break too, naming the argument.
TEST_F(CompiledMode, AHostReadOfAnArgumentIsAGraphBreak) {
  auto fn = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * item(a[1])}; };
  const CompiledFunction f("scaled", fn, fullgraph(), {"x", "scale"});
  try {
    f({ones({3}), scalar(2.0)}, {});
    FAIL() << "expected a graph break";
  } catch (const GraphBreak& e) {
    EXPECT_NE(std::string(e.what()).find("argument 1 (scale)"), std::string::npos) << e.what();
  }
  const CompiledFunction lenient("scaled", fn, CompileOptions{}, {"x", "scale"});
  EXPECT_EQ(to_vector(lenient({ones({3}), scalar(2.0)}, {})[0]), (std::vector<float>{2, 2, 2}));
  EXPECT_EQ(to_vector(lenient({ones({3}), scalar(5.0)}, {})[0]), (std::vector<float>{5, 5, 5}));
}

TEST_F(CompiledMode, DynamicShapesAreRefused) {
  CompileOptions o;
  o.dynamic = true;
  try {
    CompiledFunction("toy", [](const std::vector<Tensor>& a) { return a; }, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use static shapes"), std::string::npos) << e.what();
  }
}

// Parameters are bound per call: other weights of the same shape run the same executable.
TEST_F(CompiledMode, WeightsAreRuntimeArgumentsNotConstants) {
  const Tensor x = from_vector(test::random_values(24, 1), {2, 3, 4});
  // w1 and b1 share one buffer, as every weight of an mmapped checkpoint does; w2 and b2 do not.
  const Tensor packed = from_vector(test::random_values(25, 2), {25});
  const Tensor w1 = reshape(slice(packed, 0, 0, 20), {5, 4}), b1 = slice(packed, 0, 20, 25);
  const Tensor w2 = from_vector(test::random_values(20, 4), {5, 4}), b2 = from_vector(test::random_values(5, 5), {5});
  const CompiledFunction f(
      "toy_linear", [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{silu(linear(a[0], w1, b1))}; }, {});
  EXPECT_TRUE(same_bits(f({x}, {w1, b1})[0], silu(linear(x, w1, b1))));
  EXPECT_TRUE(same_bits(f({x}, {w2, b2})[0], silu(linear(x, w2, b2))));
  EXPECT_EQ(compile_stats().traces, 1u);
  EXPECT_EQ(compile_stats().compiles, 1u);
  EXPECT_EQ(f.signatures(), 1u);
}

TEST_F(CompiledMode, AStateTensorThatIsNotAParameterIsAnError) {
  const Tensor hidden = from_vector({1, 2}, {2});
  const CompiledFunction f("leaky", [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] + hidden}; },
                           {});
  try {
    f({from_vector({3, 4}, {2})}, {});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("neither an argument nor a parameter"), std::string::npos) << e.what();
  }
}

TEST_F(CompiledMode, ARecompileStormWarnsThenRunsEagerlyOrFails) {
  auto fn = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] * 3.0}; };
  CompileOptions o;
  o.cache_size_limit = 2;
  const CompiledFunction f("stormy", fn, o);
  testing::internal::CaptureStderr();
  for (int64_t n = 1; n <= 4; ++n) {
    const Tensor x = ones({n});
    EXPECT_EQ(to_vector(f({x}, {})[0]), std::vector<float>(size_t(n), 3.0f));
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("stormy has compiled 2 signatures"), std::string::npos) << err;
  EXPECT_EQ(compile_stats().compiles, 2u);
  EXPECT_EQ(compile_stats().eager_fallbacks, 2u);
  o.on_storm = CompileOptions::OnStorm::error;
  const CompiledFunction strict("stormy", fn, o);
  strict({ones({1})}, {});
  strict({ones({2})}, {});
  testing::internal::CaptureStderr();
  EXPECT_THROW(strict({ones({3})}, {}), Error);
  testing::internal::GetCapturedStderr();
}

// ---- memory ----

// A producer+row-op chain (linear then RMSNorm) whose result is read only later, through a
// view: its bytes are live from the chain's own launch, so the planner must not give them to
// the value the chain reads (y here), which the GEMM would then overwrite while reading it.
TEST_F(CompiledMode, AChainResultIsLiveFromItsOwnLaunch) {
  const int64_t M = 16, N = 32, hd = 8;
  const Tensor x = from_vector(test::random_values(M * N, 1), {M, N});
  const Tensor w1 = from_vector(test::random_values(N * N, 2), {N, N});
  const Tensor w2 = from_vector(test::random_values(N * N, 3), {N, N});
  const Tensor w3 = from_vector(test::random_values(N * N, 4), {N, N}), g = from_vector(test::random_values(hd, 5), {hd});
  auto fn = [&](const std::vector<Tensor>& a) {
    const Tensor y = linear(a[0], w1);
    const Tensor z = rms_norm(reshape(linear(y, w2), {M, N / hd, hd}), g, 1e-6);
    return std::vector<Tensor>{linear(reshape(z, {M, N}), w3)};
  };
  const Tensor want = fn({x})[0];
  EXPECT_TRUE(same_bits(CompiledFunction("chain", fn, {})({x}, {w1, w2, w3, g})[0], want));
  // The plan itself: the chain's result and what its GEMM reads never share bytes.
  const detail::Captured cap = detail::capture("chain", [&] { return fn({x}); });
  const auto compiled = compile_graph(cap.graph, {}, /*plan_memory=*/true);
  const Graph& gr = compiled->graph;
  int checked = 0;
  for (const LaunchGroup& grp : compiled->groups) {
    if (grp.kind != LaunchGroup::Kind::epilogue || grp.chain.size() < 2) continue;
    const int read = gr.nodes[size_t(grp.chain[0])].args[0];
    const auto range = [&](int v) {
      const int64_t at = compiled->memory.offset[size_t(v)];
      return std::make_pair(at, at + int64_t(numel(gr.shape_of(v)) * 4));
    };
    ASSERT_GE(compiled->memory.offset[size_t(read)], 0);
    ASSERT_GE(compiled->memory.offset[size_t(grp.result)], 0);
    const auto [a0, a1] = range(read);
    const auto [b0, b1] = range(grp.result);
    EXPECT_TRUE(a1 <= b0 || b1 <= a0) << "y at [" << a0 << "," << a1 << "), the chain's result at [" << b0 << "," << b1
                                      << ")";
    ++checked;
  }
  EXPECT_EQ(checked, 1);
}

// Random inputs of one double block of `model`: 64 image and 16 text tokens.
struct DoubleBlockInputs {
  Tensor x, c, temb;
  nn::RotaryTables rope;
};
DoubleBlockInputs double_block_inputs(const FluxTransformer2DModel& model) {
  const auto& cfg = model.config();
  const int64_t L_img = 64, L_txt = 16, D = cfg.inner_dim(), hd = cfg.attention_head_dim, S = L_img + L_txt;
  return {from_vector(test::random_values(L_img * D, 1), {1, L_img, D}),
          from_vector(test::random_values(L_txt * D, 2), {1, L_txt, D}),
          from_vector(test::random_values(D, 3), {1, D}),
          nn::RotaryTables::of(from_vector(test::random_values(S * hd, 4), {S, hd}),
                                 from_vector(test::random_values(S * hd, 5), {S, hd}))};
}

// A double block's RoPE reads the per-head RMSNorm's rows through the pair-reversed view. On a
// device whose fused tiles hold whole rows (the CPU) it runs as the norm's in-place epilogue; on
// one that gives each thread one element that read would race, so partition keeps RoPE in
// launches of its own. Both partitions compute the same bits, and compile_graph asks the device.
TEST_F(CompiledMode, RowLocalEpiloguesOnlyWhereTheDeviceTilesWholeRows) {
  const FluxTransformer2DModel model =
      FluxTransformer2DModel::from_pretrained(test::pipeline_dir("flux1_tiny_arch") / "transformer");
  const auto [x, c, temb, rope] = double_block_inputs(model);
  const flux::FluxTransformerBlock& block = model.transformer_blocks()[0];
  const detail::Captured cap = detail::capture("block", [&] {
    const auto [co, xo] = block.forward(x, c, temb, rope);
    return std::vector<Tensor>{co, xo};
  });
  const auto row_local = [](const std::vector<LaunchGroup>& groups) {
    int n = 0;
    for (const LaunchGroup& grp : groups) n += grp.kind == LaunchGroup::Kind::epilogue && grp.slice_axis >= 0;
    return n;
  };
  const auto launches = [](const std::vector<LaunchGroup>& groups) {
    int n = 0;
    for (const LaunchGroup& grp : groups) n += grp.launches();
    return n;
  };
  const std::vector<LaunchGroup> whole = partition(cap.graph, FusionLimits{.whole_row_tiles = true});
  const std::vector<LaunchGroup> element = partition(cap.graph, FusionLimits{.whole_row_tiles = false});
  EXPECT_GT(row_local(whole), 0) << "q and k of both streams take RoPE in place";
  EXPECT_EQ(row_local(element), 0);
  EXPECT_GT(launches(element), launches(whole));
  ASSERT_TRUE(runtime(Device::cpu()).fused_tiles_hold_whole_rows());
  EXPECT_EQ(row_local(compile_graph(cap.graph)->groups), row_local(whole));

  const std::vector<Tensor> inputs = cap.inputs;
  const auto run = [&](const std::vector<LaunchGroup>& groups) {
    return run_graph(finish_compiled_graph(cap.graph, groups, /*plan_memory=*/false), inputs);
  };
  const std::vector<Tensor> a = run(whole), b = run(element);
  ASSERT_EQ(a.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i], b[i])) << "output " << i;
}

// A block's intermediates live in one arena whose bytes are reused by values with disjoint
// lifetimes; a call allocates that arena and the outputs, nothing per launch.
TEST_F(CompiledMode, IntermediatesLiveInOnePlannedArena) {
  const FluxTransformer2DModel model =
      FluxTransformer2DModel::from_pretrained(test::pipeline_dir("flux1_tiny_arch") / "transformer");
  const auto [x, c, temb, rope] = double_block_inputs(model);
  flux::FluxTransformerBlock block = model.transformer_blocks()[0];
  const auto [c_eager, x_eager] = block.forward(x, c, temb, rope);
  block.compile(fullgraph());
  block(x, c, temb, rope);  // compiles
  const CompileEvent ev = compile_stats().events.at(0);
  DeviceRuntime& rt = runtime(Device::cpu());
  synchronize(Device::cpu());
  const uint64_t before = rt.memory().allocations;
  const auto [c_out, x_out] = block(x, c, temb, rope);
  const uint64_t allocated = rt.memory().allocations - before;
  EXPECT_GT(ev.arena_bytes, 0u);
  EXPECT_EQ(allocated, 3u) << "one arena and the two outputs";
  EXPECT_TRUE(same_bits(c_out, c_eager));
  EXPECT_TRUE(same_bits(x_out, x_eager));
  // The arena is smaller than the intermediates laid end to end.
  EXPECT_LT(ev.arena_bytes, ev.planned_bytes);
}

// Whether this oneDNN is one where packing must keep the bits: its f32 brgemm, which reads plain
// and packed weights alike, runs wherever the CPU has AVX-512 (linear_gemm.h). There the prepack
// tests below must see packs; elsewhere they check that nothing is packed.
bool packing_expected_here() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512_core = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & avx512_core) == avx512_core;
}

// Compiled mode reads the module's linear weights pre-packed: the first call packs each
// multi-row linear's weight once (into device memory, kept beside the weight), later calls reuse
// the packs and no linear packs its weight inside the call; the bits stay strict eager's. With
// prepack_weights=false, or under a device memory capacity, nothing is packed. Where oneDNN would
// read a pack with another kernel than the plain weight (other bits), that weight is never packed
// and its linear reads it plain, which the counts check instead.
TEST_F(CompiledMode, LinearsReadTheModuleWeightsPrepackedOnce) {
  const FluxTransformer2DModel model =
      FluxTransformer2DModel::from_pretrained(test::pipeline_dir("flux1_tiny_arch") / "transformer");
  const int64_t D = model.config().inner_dim(), H = model.config().mlp_hidden();
  const auto [x, c, temb, rope] = double_block_inputs(model);
  // A double block's multi-row linears: per stream (image, text) q, k, v and the output
  // projection [D,D], and the MLP's [H,D] and [D,H]; its two modulation linears read one row
  // (temb) and run as a GEMV.
  const uint64_t linears = 2 * 6;
  const auto keeps = [](int64_t N, int64_t K) { return uint64_t(cpu::linear_packing_keeps_bits(N, K)); };
  const uint64_t packable = 2 * (4 * keeps(D, D) + keeps(H, D) + keeps(D, H));
  if (packing_expected_here()) {
    EXPECT_EQ(packable, linears) << "oneDNN on AVX-512 packs without changing bits";
  }
  const uint64_t plain = linears - packable;
  const auto [c_eager, x_eager] = model.transformer_blocks()[0].forward(x, c, temb, rope);

  DeviceRuntime& rt = runtime(Device::cpu());
  flux::FluxTransformerBlock block = model.transformer_blocks()[0];
  block.compile(fullgraph());
  synchronize(Device::cpu());
  const size_t in_use = rt.memory().in_use_bytes;
  auto run = [&](const char* what) {
    const cpu::PrepackStats p0 = cpu::prepack_stats();
    const cpu::LinearGemmCounts g0 = cpu::linear_gemm_counts();
    const auto [c_out, x_out] = block(x, c, temb, rope);
    EXPECT_TRUE(same_bits(c_out, c_eager)) << what;
    EXPECT_TRUE(same_bits(x_out, x_eager)) << what;
    synchronize(Device::cpu());
    const cpu::PrepackStats p1 = cpu::prepack_stats();
    const cpu::LinearGemmCounts g1 = cpu::linear_gemm_counts();
    return std::tuple{p1.packed - p0.packed, p1.reused - p0.reused, p1.skipped - p0.skipped, p1.bytes - p0.bytes,
                      g1.prepacked - g0.prepacked, g1.packed_in_call - g0.packed_in_call};
  };
  {
    const auto [packed, reused, skipped, bytes, read_prepacked, packed_in_call] = run("first call");
    EXPECT_EQ(packed, packable);
    EXPECT_EQ(reused, 0u);
    EXPECT_EQ(skipped, plain);
    EXPECT_EQ(read_prepacked, int64_t(packable));
    EXPECT_EQ(packed_in_call, int64_t(plain));
    EXPECT_EQ(bytes == 0, packable == 0);
    EXPECT_GE(rt.memory().in_use_bytes - in_use, bytes) << "the packs live in device memory";
  }
  {
    const auto [packed, reused, skipped, bytes, read_prepacked, packed_in_call] = run("second call");
    EXPECT_EQ(packed, 0u);
    EXPECT_EQ(reused, packable);
    EXPECT_EQ(skipped, plain);
    EXPECT_EQ(read_prepacked, int64_t(packable));
    EXPECT_EQ(packed_in_call, int64_t(plain));
  }
  {
    CompileOptions off = fullgraph();
    off.prepack_weights = false;
    flux::FluxTransformerBlock unpacked = model.transformer_blocks()[1];
    unpacked.compile(off);
    const cpu::PrepackStats p0 = cpu::prepack_stats();
    const cpu::LinearGemmCounts g0 = cpu::linear_gemm_counts();
    const auto [c_eager1, x_eager1] = model.transformer_blocks()[1].forward(x, c, temb, rope);
    const auto [c_out, x_out] = unpacked(x, c, temb, rope);
    EXPECT_TRUE(same_bits(c_out, c_eager1));
    EXPECT_TRUE(same_bits(x_out, x_eager1));
    synchronize(Device::cpu());
    EXPECT_EQ(cpu::prepack_stats().packed, p0.packed);
    EXPECT_EQ(cpu::linear_gemm_counts().prepacked, g0.prepacked) << "eager and prepack_weights=false read plain";
  }
  {
    // Under a memory capacity the fail-fast plan counts no packs: the linears read plain weights.
    flux::FluxTransformerBlock capped = model.transformer_blocks()[1];
    capped.compile(fullgraph());
    rt.set_memory_capacity(size_t(1) << 40);
    const cpu::PrepackStats p0 = cpu::prepack_stats();
    const auto [c_out, x_out] = capped(x, c, temb, rope);
    synchronize(Device::cpu());
    rt.set_memory_capacity(0);
    EXPECT_EQ(cpu::prepack_stats().packed, p0.packed);
    EXPECT_EQ(cpu::prepack_stats().skipped - p0.skipped, linears);
    const auto [c_eager1, x_eager1] = model.transformer_blocks()[1].forward(x, c, temb, rope);
    EXPECT_TRUE(same_bits(c_out, c_eager1));
    EXPECT_TRUE(same_bits(x_out, x_eager1));
  }
}

// Linears of 1024 rows and more stay on dnnl_sgemm in every mode (faster there than the
// primitive reading plain weights, kernels/linear_gemm.h), so compiled mode packs nothing for
// them; below that their weights are packed (where packing keeps the bits). Either way the bits
// are strict eager's.
TEST_F(CompiledMode, OnlyLinearsOnTheGemmPrimitiveReadPackedWeights) {
  const bool packs = cpu::linear_packing_keeps_bits(48, 32);
  if (packing_expected_here()) {
    EXPECT_TRUE(packs) << "oneDNN on AVX-512 packs without changing bits";
  }
  const uint64_t live = cpu::prepack_stats().live_bytes;
  {
    const Tensor w = from_vector(test::random_values(48 * 32, 7), {48, 32});
    const Tensor b = from_vector(test::random_values(48, 8), {48});
    const CompiledFunction f(
        "toy_linear", [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{linear(a[0], w, b)}; }, {});
    for (const int64_t rows : {cpu::kPrimitiveMaxRows - 1, cpu::kPrimitiveMaxRows}) {
      const Tensor x = from_vector(test::random_values(rows * 32, 9), {rows, 32});
      const cpu::PrepackStats before = cpu::prepack_stats();
      const Tensor y = f({x}, {w, b})[0];
      EXPECT_TRUE(same_bits(y, linear(x, w, b))) << rows;
      synchronize(Device::cpu());
      const bool on_primitive = rows < cpu::kPrimitiveMaxRows;
      EXPECT_EQ(cpu::prepack_stats().packed - before.packed, packs && on_primitive ? 1u : 0u) << rows;
      EXPECT_EQ(cpu::prepack_stats().skipped - before.skipped, !packs && on_primitive ? 1u : 0u) << rows;
    }
    if (packs) {
      EXPECT_GT(cpu::prepack_stats().live_bytes, live);
    }
  }
  EXPECT_EQ(cpu::prepack_stats().live_bytes, live) << "the pack dies with its weight";
}

}  // namespace
}  // namespace kiln
