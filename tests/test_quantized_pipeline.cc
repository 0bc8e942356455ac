// FluxPipeline with a quantized transformer (--quantize): the image against the bf16 one, the
// same bytes in every execution mode, and the weights held in their quantized storage.
#include <cmath>

#include "call_args.h"
#include "exec/executable_store.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "distributed/tensor_parallel.h"
#include "golden.h"
#include "models/flux/flux_transformer.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

const std::string kSet = "flux1_tiny_arch";

PipelineOptions bf16(std::optional<DType> quantize = std::nullopt) {
  PipelineOptions o;
  o.dtype = DType::bf16;
  if (quantize) o.quantize["transformer"] = *quantize;
  return o;
}

double psnr(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double se = 0;
  for (size_t i = 0; i < a.size(); ++i) se += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  const double mse = se / double(a.size());
  return mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
}

PipelineCallArgs call() {
  PipelineCallArgs args = test::fixture_call_args(kSet);
  args.latents = test::golden(kSet, "latents.initial_packed");
  return args;
}

// Bytes of the transformer's weights held in `type`.
size_t bytes_in(const FluxPipeline& pipe, DType type) {
  size_t n = 0;
  for (const auto& [key, t] : pipe.transformer_parameters())
    if (t.dtype() == type) n += t.nbytes();
  return n;
}

class QuantizedFluxPipeline : public testing::TestWithParam<DType> {};

// Q8_0 keeps 8 bits per weight with a scale per 32: the image stays within 30 dB PSNR of the bf16
// one. Q4_K (4 bits, a scale per 32, two f16 per 256) is stated, not bounded: in this fixture
// (hidden size 64) only the feed-forward output projections have whole 256-element rows to
// quantize, so its figure says little about real widths (docs/quantization.md).
TEST_P(QuantizedFluxPipeline, ImageAgainstTheBf16Image) {
  const DType q = GetParam();
  const FluxPipeline reference = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16());
  const FluxPipeline quantized = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(q));
  EXPECT_GT(bytes_in(quantized, q), 0u) << "nothing was quantized";
  EXPECT_EQ(bytes_in(reference, q), 0u);
  for (const auto& [component, dtype] : quantized.dtypes()) EXPECT_EQ(dtype, DType::bf16) << component;
  const PipelineOutput want = reference(call()), got = quantized(call());
  const double db = psnr(got.image, want.image);
  std::printf("%s transformer vs bf16: image PSNR %.2f dB (%zu of the transformer's weight bytes quantized)\n",
              dtype_name(q), db, bytes_in(quantized, q));
  EXPECT_NE(got.image, want.image) << "the quantized weights were not used";
  if (q == DType::q8_0) {
    EXPECT_GE(db, 30.0);
  }
  EXPECT_GE(db, 10.0);  // an image of the same scene, not noise
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedFluxPipeline, testing::Values(DType::q8_0, DType::q4_k, DType::q4_0),
                         [](const testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

class QuantizedModes : public testing::TestWithParam<DType> {};

// Strict eager, deferred-and-fused, and compiled (whole and repeated blocks): one image, byte for
// byte, in each format.
TEST_P(QuantizedModes, EveryModeGivesTheSameImageByteForByte) {
  set_executable_cache_dir({});
  const DType q = GetParam();
  const FluxPipeline eager = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(q));
  const PipelineOutput want = eager(call());
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    EXPECT_EQ(eager(call()).image, want.image) << "deferred";
  }
  for (const bool blocks : {false, true}) {
    FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(q));
    CompileOptions o;
    o.fullgraph = true;
    if (blocks) pipe.transformer().compile_repeated_blocks(o);
    else pipe.transformer().compile(o);
    EXPECT_EQ(pipe(call()).image, want.image) << (blocks ? "compiled blocks" : "compiled whole");
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedModes,
                         testing::Values(DType::q8_0, DType::q4_0, DType::q4_k, DType::q5_k, DType::f8_e4m3, DType::f8_e5m2),
                         [](const testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(QuantizedFluxPipelineErrors, UnknownComponentAndTensorParallelAreRefusedBeforeLoading) {
  PipelineOptions o = bf16();
  o.quantize["unet"] = DType::q8_0;
  test::expect_error([&] { (void)FluxPipeline::from_pretrained(test::pipeline_dir(kSet), o); },
                     {"quantization given for unknown component 'unet'", "transformer"});
  PipelineOptions tp = bf16(DType::q8_0);
  tp.tensor_parallel = TensorParallelConfig{DeviceMesh(ProcessGroup::detached(0, 2))};
  test::expect_error([&] { (void)FluxPipeline::from_pretrained(test::pipeline_dir(kSet), tp); },
                     {"tensor parallelism (--tp) with --quantize or a single-file checkpoint is not supported"});
}

// Model offload moves quantized weights as they are (their bytes, not a float copy): the same
// image, and the transformer's device copy is its quantized size.
TEST(QuantizedFluxPipelineOffload, ModelOffloadGivesTheSameImage) {
  const FluxPipeline in_place = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(DType::q4_k));
  const PipelineOutput want = in_place(call());
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(DType::q4_k));
  pipe.enable_model_cpu_offload();
  EXPECT_EQ(pipe(call()).image, want.image);
  size_t moved = 0;
  for (const OffloadEvent& e : pipe.offload_events())
    if (e.component == "transformer" && e.action == "onload") moved = std::max(moved, size_t(e.bytes));
  size_t held = 0;
  for (const auto& [key, t] : pipe.transformer_parameters()) held += t.nbytes();
  EXPECT_EQ(moved, held);
}

std::map<std::string, size_t> bytes_by_place(const FluxPipeline& pipe) {
  std::map<std::string, size_t> n;
  for (const DiffusionPipeline::WeightBytes& w : pipe.weight_bytes())
    for (const auto& [place, bytes] : w.by_place) n[place] += bytes;
  return n;
}

// A transformer quantized at load has no checkpoint pages to fall back on: model offload moves
// its bytes (and every other copy made at load) into a spill file instead of holding them in
// memory beside the device copy. The image is unchanged, and again on a second call (the spilled
// bytes came back from the file).
TEST(QuantizedFluxPipelineOffload, ModelOffloadMovesHostCopiesIntoASpillFile) {
  // Under the working folder (the build tree), which is on disk where /tmp may be in memory.
  const test::ScopedTempDir dir("spill", std::filesystem::current_path());
  const test::ScopedEnv spill_dir("KILN_SPILL_DIR", dir.path().c_str());
  const FluxPipeline in_place = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(DType::q8_0));
  const PipelineOutput want = in_place(call());
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(DType::q8_0));
  const std::map<std::string, size_t> before = bytes_by_place(pipe);
  ASSERT_GT(before.count("host_copy"), 0u);
  EXPECT_EQ(before.count("spill_file"), 0u);
  pipe.enable_model_cpu_offload();
  const std::map<std::string, size_t> after = bytes_by_place(pipe);
  EXPECT_EQ(after.count("host_copy"), 0u);
  EXPECT_EQ(after.at("spill_file"), before.at("host_copy"));
  EXPECT_EQ(pipe(call()).image, want.image);
  EXPECT_EQ(pipe(call()).image, want.image);
  EXPECT_EQ(bytes_by_place(pipe), after);  // back in the file after each call
}

// KILN_SPILL_DIR=none, or a folder that cannot take the bytes, keeps them in memory as before:
// the latter says so in a warning naming the folder, and the image is the same.
TEST(QuantizedFluxPipelineOffload, WithoutASpillFolderHostCopiesStayInMemory) {
  const FluxPipeline in_place = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(DType::q8_0));
  const PipelineOutput want = in_place(call());
  {
    const test::ScopedEnv off("KILN_SPILL_DIR", "none");
    FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), bf16(DType::q8_0));
    pipe.enable_model_cpu_offload();
    EXPECT_EQ(bytes_by_place(pipe).count("spill_file"), 0u);
    EXPECT_EQ(pipe(call()).image, want.image);
  }
  const test::ScopedEnv missing("KILN_SPILL_DIR", "/proc/kiln-no-such-folder");
  std::vector<std::string> warnings;
  PipelineOptions o = bf16(DType::q8_0);
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(kSet), o);
  pipe.enable_model_cpu_offload();
  EXPECT_EQ(bytes_by_place(pipe).count("spill_file"), 0u);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("in memory"), std::string::npos) << warnings[0];
  EXPECT_NE(warnings[0].find("/proc/kiln-no-such-folder"), std::string::npos) << warnings[0];
  EXPECT_EQ(pipe(call()).image, want.image);
}

}  // namespace
}  // namespace kiln
