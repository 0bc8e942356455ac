// FluxPipeline in bf16 (PipelineOptions::dtype, Diffusers' torch_dtype=torch.bfloat16): against
// Diffusers' f32 outputs within bf16's precision, the same bytes in every execution mode, and
// weights kept in their stored dtype (no f32 copy of any weight).
#include <unistd.h>

#include <cmath>

#include "exec/compile.h"
#include "exec/executable_store.h"
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

PipelineOptions in(std::optional<DType> dtype) {
  PipelineOptions o;
  o.dtype = dtype;
  return o;
}

// ||a - b|| / ||b|| over all elements.
double relative_l2(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = to_vector(cast(a, DType::f32)), y = to_vector(cast(b, DType::f32));
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * double(x[i] - y[i]), den += double(y[i]) * y[i];
  return std::sqrt(num / den);
}

double psnr(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double se = 0;
  for (size_t i = 0; i < a.size(); ++i) se += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  const double mse = se / double(a.size());
  return mse == 0 ? 99.0 : 10 * std::log10(255.0 * 255.0 / mse);
}

class Bf16PipelineGolden : public testing::TestWithParam<std::string> {};

// bf16 keeps 8 significant bits (relative rounding 2^-9 = 2e-3 per op); through the 4-step
// pipeline the final latents land within 1e-2 relative L2 of Diffusers' f32 latents here
// (measured: see docs/testing.md), and the image PSNR well above the 30 dB asked of bf16.
TEST_P(Bf16PipelineGolden, StaysWithinBf16PrecisionOfDiffusersF32) {
  const std::string set = GetParam();
  const FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(set), in(DType::bf16));
  for (const auto& [component, dtype] : pipe.dtypes()) EXPECT_EQ(dtype, DType::bf16) << component;
  PipelineCallArgs args = test::fixture_call_args(set);
  args.latents = test::golden(set, "latents.initial_packed");
  const PipelineOutput out = pipe(args);
  EXPECT_EQ(out.latents.dtype(), DType::bf16);
  const std::string last = "latents.after_step" + std::to_string(args.num_inference_steps - 1);
  const double rel = relative_l2(out.latents, test::golden(set, last));
  const double db = psnr(out.image, test::golden_u8(set, "image.uint8"));
  std::printf("%s bf16: final latents relative L2 %.3e, image PSNR %.2f dB\n", set.c_str(), rel, db);
  EXPECT_LE(rel, 1e-2) << set;
  EXPECT_GE(db, 30.0) << set;
  // Not the f32 result: the run really computed in bf16.
  EXPECT_GT(rel, 1e-5) << set;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16PipelineGolden, testing::Values("flux1_tiny", "flux1_tiny_arch"));

CompileOptions fullgraph() {
  CompileOptions o;
  o.fullgraph = true;
  return o;
}

// Strict eager, deferred-and-fused, compiled whole and compiled blocks (with and without
// pre-packed weights): one bf16 image, byte for byte, and the same final latents bit for bit.
TEST(Bf16Pipeline, EveryModeGivesTheSameImageByteForByte) {
  set_executable_cache_dir({});
  const std::string set = "flux1_tiny_arch";
  PipelineCallArgs args = test::fixture_call_args(set);
  args.latents = test::golden(set, "latents.initial_packed");
  const FluxPipeline eager = FluxPipeline::from_pretrained(test::pipeline_dir(set), in(DType::bf16));
  const PipelineOutput want = eager(args);
  const std::vector<float> want_latents = to_vector(cast(want.latents, DType::f32));
  const auto same = [&](const PipelineOutput& got, const std::string& what) {
    EXPECT_EQ(got.image, want.image) << what;
    EXPECT_EQ(to_vector(cast(got.latents, DType::f32)), want_latents) << what;
  };
  {
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    same(eager(args), "deferred");
  }
  for (const std::string how : {"full", "blocks"})
    for (const bool prepack : {true, false}) {
      FluxPipeline pipe = FluxPipeline::from_pretrained(test::pipeline_dir(set), in(DType::bf16));
      CompileOptions o = fullgraph();
      o.prepack_weights = prepack;
      if (how == "full") pipe.transformer().compile(o);
      else pipe.transformer().compile_repeated_blocks(o);
      same(pipe(args), "compiled " + how + (prepack ? " (pre-packed)" : ""));
    }
}

// A copy of a fixture's pipeline folder with every floating-point tensor stored as `dtype`
// (what a bf16 checkpoint from the Hub is), removed at the end.
class StoredAs : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_bf16_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::copy(test::pipeline_dir("flux1_tiny_arch"), dir_, fs::copy_options::recursive);
    for (const auto& entry : fs::recursive_directory_iterator(dir_)) {
      if (entry.path().extension() != ".safetensors") continue;
      std::vector<std::pair<std::string, Tensor>> tensors;
      {
        const io::SafetensorsFile src(entry.path());
        for (const std::string& name : src.names()) {
          const Tensor t = src.load(name);
          tensors.emplace_back(name, is_floating(t.dtype()) ? contiguous(cast(t, DType::bf16)) : t);
          wait(tensors.back().second);
          file_bytes_ += tensors.back().second.nbytes();
        }
      }
      io::save_safetensors(entry.path(), tensors);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  static size_t sum(const std::map<std::string, size_t>& m) {
    size_t n = 0;
    for (const auto& [k, v] : m) n += v;
    return n;
  }
  fs::path dir_;
  size_t file_bytes_ = 0;
};

// "auto" takes the checkpoint's dtype: every weight stays bf16, read in place from the mapped
// file, and the weights held are exactly the files' tensor bytes (no f32 copy of any weight).
TEST_F(StoredAs, Bf16CheckpointRunsInBf16WithItsWeightsReadInPlace) {
  const FluxPipeline pipe = FluxPipeline::from_pretrained(dir_, in(std::nullopt));
  for (const auto& [component, dtype] : pipe.dtypes()) EXPECT_EQ(dtype, DType::bf16) << component;
  size_t total = 0;
  for (const FluxPipeline::WeightBytes& w : pipe.weight_bytes()) {
    EXPECT_EQ(w.by_dtype.size(), 1u) << w.component;
    EXPECT_EQ(w.by_dtype.count("bf16"), 1u) << w.component;
    EXPECT_EQ(w.by_place.count("host_copy"), 0u) << w.component;
    total += sum(w.by_place);
  }
  // Every tensor but the few a model does not read (none in these fixtures' components).
  EXPECT_EQ(total, file_bytes_);
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
  args.latents = test::golden("flux1_tiny_arch", "latents.initial_packed");
  const PipelineOutput out = pipe(args);
  EXPECT_GE(psnr(out.image, test::golden_u8("flux1_tiny_arch", "image.uint8")), 30.0);
}

// A bf16 checkpoint asked for f32 compute: converted once at load (host copies in f32) and then
// the f32 path, which on bf16-rounded weights stays close to Diffusers' f32 image.
TEST_F(StoredAs, Bf16CheckpointLoadedAsF32IsConvertedOnceAtLoad) {
  const FluxPipeline pipe = FluxPipeline::from_pretrained(dir_, in(DType::f32));
  size_t total = 0;
  for (const FluxPipeline::WeightBytes& w : pipe.weight_bytes()) {
    EXPECT_EQ(w.by_dtype.count("f32"), 1u) << w.component;
    EXPECT_EQ(w.by_dtype.size(), 1u) << w.component;
    EXPECT_EQ(w.by_place.count("mapped_file"), 0u) << w.component;
    total += sum(w.by_dtype);
  }
  EXPECT_EQ(total, 2 * file_bytes_);
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
  args.latents = test::golden("flux1_tiny_arch", "latents.initial_packed");
  EXPECT_GE(psnr(pipe(args).image, test::golden_u8("flux1_tiny_arch", "image.uint8")), 30.0);
}

// A per-component choice wins over the pipeline's; the transformer gets its inputs in its dtype.
TEST_F(StoredAs, PerComponentDtypeOverridesThePipelines) {
  PipelineOptions o = in(DType::bf16);
  o.component_dtype["vae"] = DType::f32;
  const FluxPipeline pipe = FluxPipeline::from_pretrained(dir_, o);
  const auto dtypes = pipe.dtypes();
  EXPECT_EQ(dtypes[2].second, DType::bf16);
  EXPECT_EQ(dtypes[3].first, "vae");
  EXPECT_EQ(dtypes[3].second, DType::f32);
  PipelineCallArgs args = test::fixture_call_args("flux1_tiny_arch");
  args.latents = test::golden("flux1_tiny_arch", "latents.initial_packed");
  EXPECT_GE(psnr(pipe(args).image, test::golden_u8("flux1_tiny_arch", "image.uint8")), 30.0);
  PipelineOptions bad;
  bad.component_dtype["unet"] = DType::bf16;
  test::expect_error([&] { FluxPipeline::from_pretrained(dir_, bad); }, {"unknown component 'unet'", "transformer"});
}

}  // namespace
}  // namespace kiln
