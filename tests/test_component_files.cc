// A pipeline component's weights from one file (--transformer FILE, --vae FILE): a single-file
// checkpoint in the original layout gives the folder's image byte for byte, and a GGUF
// transformer written from a quantized pipeline (what kiln convert writes) gives the image of
// quantizing at load.
#include <unistd.h>

#include <filesystem>

#include "call_args.h"
#include "exec/host.h"
#include "golden.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "models/transformer_families.h"
#include "nn/key_mapped_source.h"
#include "nn/tensor_map_source.h"
#include "pipelines/flux_pipeline.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

const std::string kSet = "flux1_tiny_arch";

class ComponentFiles : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_component_files_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static PipelineCallArgs call() {
    PipelineCallArgs args = test::fixture_call_args(kSet);
    args.latents = test::golden(kSet, "latents.initial_packed");
    return args;
  }
  fs::path dir_;
};

// FLUX.1's transformer in BFL names (ComfyUI's prefix) and the VAE in LDM names, each given as
// one file: the same image as the Diffusers folder, every tensor of both files read.
TEST_F(ComponentFiles, OriginalLayoutFilesGiveTheFoldersImage) {
  const fs::path folder = test::pipeline_dir(kSet);
  const fs::path transformer = dir_ / "flux1.safetensors", vae = dir_ / "ae.safetensors";
  nn::write_original_layout(*nn::open_checkpoint(folder / "transformer"), original_key_map(io::Layout::flux1_bfl),
                            transformer, "model.diffusion_model.");
  nn::write_original_layout(*nn::open_checkpoint(folder / "vae"), original_key_map(io::Layout::ldm_vae), vae);
  PipelineOptions o;
  o.strict = true;  // a tensor of either file left unread is an error
  const PipelineOutput want = FluxPipeline::from_pretrained(folder, o)(call());
  o.component_files["transformer"] = transformer;
  o.component_files["vae"] = vae;
  const PipelineOutput got = FluxPipeline::from_pretrained(folder, o)(call());
  EXPECT_EQ(got.image, want.image);
  EXPECT_EQ(to_vector(got.latents), to_vector(want.latents));
}

// The transformer of a pipeline quantized at load, written as GGUF and given back as
// --transformer FILE: the same weights (read in place from the file) and the same image.
TEST_F(ComponentFiles, GgufTransformerGivesTheImageOfQuantizingAtLoad) {
  const fs::path folder = test::pipeline_dir(kSet), file = dir_ / "transformer-q8_0.gguf";
  PipelineOptions o;
  o.dtype = DType::bf16;
  o.quantize["transformer"] = DType::q8_0;
  const FluxPipeline quantized = FluxPipeline::from_pretrained(folder, o);
  std::vector<std::pair<std::string, Tensor>> tensors(quantized.transformer_parameters().begin(),
                                                      quantized.transformer_parameters().end());
  io::write_gguf(file, {}, tensors);
  const PipelineOutput want = quantized(call());

  PipelineOptions from_file;
  from_file.dtype = DType::bf16;
  from_file.strict = true;
  from_file.component_files["transformer"] = file;
  const FluxPipeline pipe = FluxPipeline::from_pretrained(folder, from_file);
  size_t q8 = 0;
  for (const auto& [key, t] : pipe.transformer_parameters()) q8 += t.dtype() == DType::q8_0;
  EXPECT_GT(q8, 0u);
  EXPECT_EQ(pipe(call()).image, want.image);
}

// The same quantized transformer written in BFL names as GGUF (kiln convert --layout original:
// the layout stable-diffusion.cpp and ComfyUI loaders read): fused tensors joined from whole
// quantized rows, read back through the key map as zero-copy row views, the same image.
TEST_F(ComponentFiles, OriginalLayoutGgufTransformerGivesTheImageOfQuantizingAtLoad) {
  const fs::path folder = test::pipeline_dir(kSet), file = dir_ / "flux1-q4_k.gguf";
  PipelineOptions o;
  o.dtype = DType::bf16;
  o.quantize["transformer"] = DType::q4_k;
  const FluxPipeline quantized = FluxPipeline::from_pretrained(folder, o);
  const auto& params = quantized.transformer_parameters();
  nn::write_original_layout_gguf(nn::TensorMapSource(std::map<std::string, Tensor>(params.begin(), params.end())),
                                 original_key_map(io::Layout::flux1_bfl), file, {});
  EXPECT_TRUE(io::GgufFile(file).contains("double_blocks.0.img_attn.qkv.weight"));
  PipelineOptions from_file;
  from_file.dtype = DType::bf16;
  from_file.strict = true;
  from_file.component_files["transformer"] = file;
  EXPECT_EQ(FluxPipeline::from_pretrained(folder, from_file)(call()).image, quantized(call()).image);
}

// --quantize q4_0 with a Q8_0 GGUF transformer: refused before loading, naming both types (its
// linears would stay Q8_0 under a report saying q4_0); --quantize q8_0, the file's own type, loads.
TEST_F(ComponentFiles, QuantizingAnAlreadyQuantizedFileIsRefused) {
  const fs::path folder = test::pipeline_dir(kSet), file = dir_ / "transformer-q8_0.gguf";
  PipelineOptions o;
  o.quantize["transformer"] = DType::q8_0;
  {
    const FluxPipeline quantized = FluxPipeline::from_pretrained(folder, o);
    std::vector<std::pair<std::string, Tensor>> tensors(quantized.transformer_parameters().begin(),
                                                        quantized.transformer_parameters().end());
    io::write_gguf(file, {}, tensors);
  }
  o.component_files["transformer"] = file;
  o.quantize["transformer"] = DType::q4_0;
  test::expect_error([&] { (void)FluxPipeline::from_pretrained(folder, o); },
                     {"[pipeline] --quantize q4_0 for transformer", "transformer-q8_0.gguf",
                      "already stores weights quantized as q8_0", "does not requantize",
                      "leave --quantize out to run the file's q8_0"});
  o.quantize["transformer"] = DType::q8_0;
  const FluxPipeline same = FluxPipeline::from_pretrained(folder, o);
  size_t q8 = 0, q4 = 0;
  for (const auto& [key, t] : same.transformer_parameters()) {
    q8 += t.dtype() == DType::q8_0;
    q4 += t.dtype() == DType::q4_0;
  }
  EXPECT_GT(q8, 0u);
  EXPECT_EQ(q4, 0u);
}

TEST_F(ComponentFiles, AMissingFileOrAnUnknownComponentIsRefusedBeforeLoading) {
  PipelineOptions o;
  o.component_files["transformer"] = dir_ / "nope.gguf";
  test::expect_error([&] { (void)FluxPipeline::from_pretrained(test::pipeline_dir(kSet), o); },
                     {"checkpoint file for transformer", "nope.gguf", "does not exist"});
  o.component_files.clear();
  o.component_files["unet"] = dir_ / "x.gguf";
  test::expect_error([&] { (void)FluxPipeline::from_pretrained(test::pipeline_dir(kSet), o); },
                     {"a checkpoint file given for unknown component 'unet'"});
}

}  // namespace
}  // namespace kiln
