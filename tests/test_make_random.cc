// kiln make-random: real-size FLUX.1 folders with deterministic random weights. The counts follow
// the spec's formulas and the weights the declared scales (from the generator, no files); the
// CLI writes one dev folder at the real widths with 1+1 transformer blocks and 1 T5 layer (~2 GB
// in bf16, once, in one test) whose configs are the Hub's, which kiln's own loaders read with no
// tensor left over and whose components give finite O(1) outputs in bf16; bad input fails before
// anything is written. The streaming writer (byte-equal to save_safetensors, deterministic
// whatever the thread count, atomic) and the Hub-style sharding are checked on their own.
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

#include <nlohmann/json.hpp>

#include "exec/host.h"
#include "io/safetensors.h"
#include "io/safetensors_shards.h"
#include "io/safetensors_stream_writer.h"
#include "models/clip/clip_text_model.h"
#include "models/flux/flux_transformer.h"
#include "random_checkpoint/like_recipe.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/autoencoder_kl.h"
#include "nn/weight_source.h"
#include "spawn_util.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace rw = random_weights;

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun make_random(const std::string& args) {
  CliRun r;
  FILE* p = ::popen((std::string(KILN_CLI_PATH) + " make-random " + args + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && std::fgets(buf.data(), int(buf.size()), p)) r.output += buf.data();
  const int status = p ? ::pclose(p) : -1;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

// Every entry of `dir` (names only), to show that a failed run added nothing.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// FLUX.1's VAE (also SD3's but for its latent scaling).
rw::RandomComponent flux1_vae() { return rw::like_component({"flux1-schnell"}, "vae"); }

// ---- the parameter counts of spec flux1.md Appendix B, as formulas in the block counts ----

struct Count {
  int64_t tensors = 0, parameters = 0;
};

Count linear_count(int64_t in, int64_t out, bool bias = true) { return {bias ? 2 : 1, out * in + (bias ? out : 0)}; }
Count operator+(Count a, Count b) { return {a.tensors + b.tensors, a.parameters + b.parameters}; }
Count operator*(int64_t n, Count a) { return {n * a.tensors, n * a.parameters}; }

// FluxTransformer2DModel at FLUX.1's widths.
Count flux_transformer_count(bool dev, int64_t double_blocks, int64_t single_blocks) {
  const int64_t D = 3072, hd = 128;
  const Count norm{1, hd};
  Count top = linear_count(64, D) + linear_count(4096, D) + linear_count(256, D) + linear_count(D, D) +
              linear_count(768, D) + linear_count(D, D) + linear_count(D, 2 * D) + linear_count(D, 64);
  if (dev) top = top + linear_count(256, D) + linear_count(D, D);
  const Count dbl = 2 * linear_count(D, 6 * D) + 8 * linear_count(D, D) + 4 * norm +
                    2 * (linear_count(D, 4 * D) + linear_count(4 * D, D));
  const Count single = linear_count(D, 3 * D) + 3 * linear_count(D, D) + 2 * norm + linear_count(D, 4 * D) +
                       linear_count(5 * D, D);
  return top + double_blocks * dbl + single_blocks * single;
}

// T5 v1.1 XXL encoder, shared embedding counted once.
Count t5_count(int64_t layers) {
  const int64_t M = 4096, F = 10240;
  const Count block = 4 * linear_count(M, M, false) + 3 * linear_count(M, F, false) + Count{2, 2 * M};
  return Count{1, 32128 * M} + layers * block + Count{1, 32 * 64} + Count{1, M};
}

TEST(MakeRandomCounts, FormulasGiveTheSpecsFullSizeCounts) {
  // Appendix B: the formulas above are the spec's, so they can be trusted at other depths.
  EXPECT_EQ(flux_transformer_count(false, 19, 38).tensors, 1156);
  EXPECT_EQ(flux_transformer_count(false, 19, 38).parameters, 11'891'178'560);
  EXPECT_EQ(flux_transformer_count(true, 19, 38).tensors, 1160);
  EXPECT_EQ(flux_transformer_count(true, 19, 38).parameters, 11'901'408'320);
  EXPECT_EQ(t5_count(24).parameters, 4'762'310'656);
  // And the declared components at full size agree with them.
  const rw::RandomComponent schnell = rw::like_component({"flux1-schnell"}, "transformer");
  EXPECT_EQ(int64_t(schnell.tensors.size()), 1156);
  EXPECT_EQ(schnell.parameters(), 11'891'178'560);
  EXPECT_EQ(rw::like_component({"flux1-dev"}, "transformer").parameters(), 11'901'408'320);
  EXPECT_EQ(rw::like_component({"flux1-schnell"}, "text_encoder_2").parameters(), 4'762'310'656);
  const rw::RandomComponent vae = flux1_vae();
  EXPECT_EQ(vae.tensors.size(), 244u);
  EXPECT_EQ(vae.parameters(), 83'819'683);
}

// The full-size folder is sharded as on the Hub: 3 transformer shards at Diffusers'
// 10 GB, 2 T5 shards at transformers' 5 GB, the rest single files; total_size is 2 bytes a
// parameter in bf16.
TEST(MakeRandomCounts, FullSizeFilesAreShardedAsOnTheHub) {
  const std::vector<rw::RandomComponent> components = rw::like_components({"flux1-schnell"});
  std::map<std::string, std::vector<std::string>> files;
  for (const rw::RandomComponent& c : components) files[c.folder] = rw::plan_random_component(c, DType::bf16).files;
  EXPECT_EQ(files["transformer"],
            (std::vector<std::string>{"config.json", "diffusion_pytorch_model-00001-of-00003.safetensors",
                                      "diffusion_pytorch_model-00002-of-00003.safetensors",
                                      "diffusion_pytorch_model-00003-of-00003.safetensors",
                                      "diffusion_pytorch_model.safetensors.index.json"}));
  EXPECT_EQ(files["text_encoder_2"],
            (std::vector<std::string>{"config.json", "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors", "model.safetensors.index.json"}));
  EXPECT_EQ(files["text_encoder"], (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(files["vae"], (std::vector<std::string>{"config.json", "diffusion_pytorch_model.safetensors"}));
  const auto tensor_bytes = [](const rw::RandomComponent& c) {
    return io::plan_sharded_checkpoint(c.weights_base, rw::streamed_tensors(c, DType::bf16, 0), c.max_shard_bytes)
        .tensor_bytes;
  };
  EXPECT_EQ(tensor_bytes(components[2]), 2 * 11'891'178'560ull);
  EXPECT_EQ(tensor_bytes(components[1]), 2 * 4'762'310'656ull);
}

// ---- the declared scales, from the generator itself ----

// The first (up to) 4M values of tensor `name` of `c` as the writer receives them (the writer
// then rounds them to the file's dtype exactly as save_safetensors does: see
// MakeRandomWriter.StreamedFileEqualsSaveSafetensors).
std::vector<float> generated(const rw::RandomComponent& c, const std::string& name) {
  for (const io::StreamedTensor& t : rw::streamed_tensors(c, DType::bf16, 0)) {
    if (t.name != name) continue;
    std::vector<float> v(size_t(std::min<int64_t>(numel(t.shape), int64_t(1) << 22)));
    t.fill(0, int64_t(v.size()), v.data());
    return v;
  }
  ADD_FAILURE() << c.folder << " has no tensor " << name;
  return {};
}

// The weights have the scales the tool declares: a weight mapping n inputs is uniform with
// standard deviation 1/sqrt(n), the last layer of a residual branch also 1/sqrt(branches), T5's
// q also 1/sqrt(d_kv), norms the identity. Tolerance 1% on the standard deviation: its sampling
// error over the >= 18K values looked at is below 0.35% (0.03% for the 4M of the large weights);
// the mean within 4 of its standard errors.
TEST(MakeRandomScales, WeightsHaveTheDeclaredScales) {
  const rw::RandomLikeOptions shallow{"flux1-dev", {{"--blocks", {1, 1}}, {"--t5-layers", {1}}}};
  const rw::RandomComponent tr = rw::like_component(shallow, "transformer"),
                            t5 = rw::like_component(shallow, "text_encoder_2"),
                            clip = rw::like_component(shallow, "text_encoder"), vae = flux1_vae();
  const auto check = [](const rw::RandomComponent& c, const std::string& name, double want_std) {
    const std::vector<float> v = generated(c, name);
    double sum = 0, sq = 0, largest = 0;
    for (float x : v) sum += x, sq += double(x) * x, largest = std::max(largest, double(std::fabs(x)));
    const double n = double(v.size()), mean = sum / n, std = std::sqrt(sq / n - mean * mean);
    EXPECT_NEAR(std / want_std, 1.0, 0.01) << name;
    EXPECT_LT(std::fabs(mean), 4 * want_std / std::sqrt(n)) << name;
    EXPECT_LE(largest, want_std * std::sqrt(3.0)) << name;  // a uniform distribution's edge
  };
  const double D = 3072, branches = 2 * 1 + 1;  // 1 double block (2 branches) + 1 single block
  check(tr, "transformer_blocks.0.attn.to_q.weight", 1 / std::sqrt(D));
  check(tr, "transformer_blocks.0.ff.net.0.proj.weight", 1 / std::sqrt(D));
  check(tr, "transformer_blocks.0.attn.to_out.0.weight", 1 / std::sqrt(D * branches));
  check(tr, "transformer_blocks.0.ff_context.net.2.weight", 1 / std::sqrt(4 * D * branches));
  check(tr, "single_transformer_blocks.0.proj_out.weight", 1 / std::sqrt(5 * D * branches));
  check(tr, "context_embedder.weight", 1 / std::sqrt(4096.0));
  check(tr, "time_text_embed.guidance_embedder.linear_1.weight", 1 / std::sqrt(256.0));
  check(tr, "transformer_blocks.0.norm1.linear.bias", rw::kBiasStd);
  check(t5, "encoder.block.0.layer.0.SelfAttention.q.weight", 1 / std::sqrt(4096.0 * 64));
  check(t5, "encoder.block.0.layer.0.SelfAttention.k.weight", 1 / std::sqrt(4096.0));
  check(t5, "encoder.block.0.layer.1.DenseReluDense.wo.weight", 1 / std::sqrt(10240.0 * 2));
  check(t5, "shared.weight", 1.0);
  check(clip, "text_model.encoder.layers.0.mlp.fc1.weight", 1 / std::sqrt(768.0));
  check(clip, "text_model.encoder.layers.0.self_attn.out_proj.weight", 1 / std::sqrt(768.0 * 24));
  check(vae, "decoder.up_blocks.0.resnets.0.conv1.weight", 1 / std::sqrt(512.0 * 9));
  for (const auto& [c, name, value] : {std::tuple{&tr, "transformer_blocks.0.attn.norm_added_k.weight", 1.0f},
                                       std::tuple{&t5, "encoder.final_layer_norm.weight", 1.0f},
                                       std::tuple{&clip, "text_model.final_layer_norm.bias", 0.0f},
                                       std::tuple{&vae, "decoder.mid_block.resnets.0.norm1.weight", 1.0f}})
    for (float x : generated(*c, name)) ASSERT_EQ(x, value) << name;
}

// ---- the CLI, end to end ----

// Where the CLI tests write: RAM (/dev/shm) when it is there with room, since they check what
// the folder holds, not how fast a disk takes 2 GB; else the temporary folder.
fs::path scratch_root() {
  std::error_code ec;
  const fs::space_info shm = fs::space("/dev/shm", ec);
  return !ec && fs::is_directory("/dev/shm") && shm.available > (uint64_t(6) << 30) ? fs::path("/dev/shm")
                                                                                     : fs::temp_directory_path();
}

class MakeRandomCli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_root() / ("kiln_make_random_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// The Hub's configs (black-forest-labs/FLUX.1-dev, spec §1.4), typed here independently of the
// tool, with only the depths replaced; the tokenizers are the bundled checkpoint's.
void expect_hub_configs(const fs::path& dir) {
  EXPECT_EQ(read_json(dir / "model_index.json"), nlohmann::json::parse(R"({
    "_class_name": "FluxPipeline", "_diffusers_version": "0.30.0.dev0",
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5Tokenizer"],
    "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]})"));
  EXPECT_EQ(read_json(dir / "scheduler" / "scheduler_config.json"), nlohmann::json::parse(R"({
    "_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.30.0.dev0",
    "base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
    "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": true})"));
  EXPECT_EQ(read_json(dir / "transformer" / "config.json"), nlohmann::json::parse(R"({
    "_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.30.0.dev0",
    "_name_or_path": "../checkpoints/flux-dev/transformer", "attention_head_dim": 128, "guidance_embeds": true,
    "in_channels": 64, "joint_attention_dim": 4096, "num_attention_heads": 24, "num_layers": 1,
    "num_single_layers": 1, "patch_size": 1, "pooled_projection_dim": 768})"));
  EXPECT_EQ(read_json(dir / "vae" / "config.json"), nlohmann::json::parse(R"({
    "_class_name": "AutoencoderKL", "_diffusers_version": "0.30.0.dev0", "_name_or_path": "../checkpoints/flux-dev",
    "act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
    "force_upcast": true, "in_channels": 3, "latent_channels": 16, "latents_mean": null, "latents_std": null,
    "layers_per_block": 2, "mid_block_add_attention": true, "norm_num_groups": 32, "out_channels": 3,
    "sample_size": 1024, "scaling_factor": 0.3611, "shift_factor": 0.1159,
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D"],
    "use_post_quant_conv": false, "use_quant_conv": false})"));
  EXPECT_EQ(read_json(dir / "text_encoder" / "config.json"), nlohmann::json::parse(R"({
    "_name_or_path": "openai/clip-vit-large-patch14", "architectures": ["CLIPTextModel"], "attention_dropout": 0.0,
    "bos_token_id": 0, "dropout": 0.0, "eos_token_id": 2, "hidden_act": "quick_gelu", "hidden_size": 768,
    "initializer_factor": 1.0, "initializer_range": 0.02, "intermediate_size": 3072, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 77, "model_type": "clip_text_model", "num_attention_heads": 12,
    "num_hidden_layers": 12, "pad_token_id": 1, "projection_dim": 768, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.3", "vocab_size": 49408})"));
  EXPECT_EQ(read_json(dir / "text_encoder_2" / "config.json"), nlohmann::json::parse(R"({
    "_name_or_path": "google/t5-v1_1-xxl", "architectures": ["T5EncoderModel"], "classifier_dropout": 0.0,
    "d_ff": 10240, "d_kv": 64, "d_model": 4096, "decoder_start_token_id": 0, "dense_act_fn": "gelu_new",
    "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0,
    "is_encoder_decoder": true, "is_gated_act": true, "layer_norm_epsilon": 1e-06, "model_type": "t5",
    "num_decoder_layers": 24, "num_heads": 64, "num_layers": 1, "output_past": true, "pad_token_id": 0,
    "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": true, "vocab_size": 32128})"));
  const fs::path bundled = fs::path(KILN_FIXTURES_DIR) / "flux1_tiny_arch" / "pipeline";
  for (const char* t : {"tokenizer", "tokenizer_2"}) {
    EXPECT_EQ(entries(dir / t), entries(bundled / t));
    for (const auto& e : fs::directory_iterator(bundled / t))
      EXPECT_EQ(file_bytes(dir / t / e.path().filename()), file_bytes(e.path())) << e.path();
  }
}

// kiln's loaders read every component, and every tensor in it (Diffusers would warn about any
// other: the names are the state dicts'); the counts follow the spec's formulas; every tensor is
// stored in bf16; the CLI's summary says what it wrote.
void expect_loads_everything(const fs::path& dir, const std::string& summary) {
  const auto unused = [](const auto& load) {
    nn::CheckpointAudit audit;
    load();
    return audit.unused({});
  };
  const std::vector<std::string> none;
  EXPECT_EQ(unused([&] { ClipTextModel::from_pretrained(dir / "text_encoder", ClipPooledRule::eos2_argmax,
                                                        DType::bf16); }),
            none);
  EXPECT_EQ(unused([&] { T5EncoderModel::from_pretrained(dir / "text_encoder_2", DType::bf16); }), none);
  EXPECT_EQ(unused([&] { FluxTransformer2DModel::from_pretrained(dir / "transformer", DType::bf16); }), none);
  EXPECT_EQ(unused([&] { AutoencoderKL::from_pretrained(dir / "vae", DType::bf16); }), none);
  const FluxTransformerConfig c = FluxTransformerConfig::from_json(io::JsonConfig(dir / "transformer" / "config.json"));
  EXPECT_EQ(c.num_layers, 1);
  EXPECT_EQ(c.num_single_layers, 1);
  EXPECT_TRUE(c.guidance_embeds);
  EXPECT_EQ(c.inner_dim(), 3072);

  const auto count = [](const fs::path& component) {
    const io::SafetensorsIndex index(component);
    Count n;
    for (const std::string& name : index.names()) {
      const io::TensorInfo info = index.info(name);
      EXPECT_EQ(info.dtype_string, "BF16") << name;
      n = n + Count{1, kiln::numel(info.shape)};
    }
    return n;
  };
  const Count transformer = count(dir / "transformer"), t5 = count(dir / "text_encoder_2"),
              clip = count(dir / "text_encoder"), vae = count(dir / "vae");
  EXPECT_EQ(transformer.tensors, flux_transformer_count(true, 1, 1).tensors);
  EXPECT_EQ(transformer.parameters, flux_transformer_count(true, 1, 1).parameters);
  EXPECT_EQ(t5.tensors, t5_count(1).tensors);
  EXPECT_EQ(t5.parameters, t5_count(1).parameters);
  EXPECT_EQ(clip.parameters, 123'060'480);
  EXPECT_EQ(vae.tensors, 244);
  EXPECT_EQ(vae.parameters, 83'819'683);

  for (const char* line : {"text_encoder", "text_encoder_2", "transformer", "vae"})
    EXPECT_NE(summary.find(std::string("  ") + line + " "), std::string::npos) << line << "\n" << summary;
  std::string total = std::to_string(transformer.parameters + t5.parameters + clip.parameters + vae.parameters);
  for (int i = int(total.size()) - 3; i > 0; i -= 3) total.insert(size_t(i), 1, ',');
  EXPECT_NE(summary.find(total + " parameters"), std::string::npos) << total << "\n" << summary;
}

// Each component, held and computed in bf16 as a benchmark runs it, turns inputs of unit scale
// into finite values of unit scale: CLIP's residual stream before its final norm, the
// transformer's velocity and the VAE's image (none normalised at the end, so they show the
// weights' scales), and the normalised T5 output and CLIP pooled output (finite). Bounds [1/4, 4]
// on the root mean square: O(1) as the tool promises (1.55, 1.16 and 0.59 here).
void expect_unit_scale_outputs(const fs::path& dir) {
  const auto expect_unit = [](const Tensor& t, const char* what) {
    double sq = 0;
    const std::vector<float> v = to_vector(t);
    for (float x : v) {
      ASSERT_TRUE(std::isfinite(x)) << what;
      sq += double(x) * x;
    }
    const double rms = std::sqrt(sq / double(v.size()));
    EXPECT_GT(rms, 0.25) << what;
    EXPECT_LT(rms, 4.0) << what;
  };
  const auto input = [](const Shape& shape, uint32_t seed) {
    return test::random_tensor(shape, seed, DType::bf16, -1.7, 1.7);  // uniform, standard deviation 0.98
  };
  {
    const ClipTextModel clip =
        ClipTextModel::from_pretrained(dir / "text_encoder", ClipPooledRule::eos2_argmax, DType::bf16);
    const ClipTextModel::Output out =
        clip.forward(from_ints({998, 5, 17, 300, 999, 999, 999, 999}, {1, 8}), /*output_hidden_states=*/true);
    expect_unit(out.hidden_states.back(), "CLIP's residual stream after 12 layers");
    expect_unit(out.pooler_output, "CLIP pooled");
  }
  {
    const T5EncoderModel t5 = T5EncoderModel::from_pretrained(dir / "text_encoder_2", DType::bf16);
    expect_unit(t5.forward(from_ints({37, 5, 500, 1, 0, 0}, {1, 6})).last_hidden_state, "T5 output");
  }
  {
    const FluxTransformer2DModel tr = FluxTransformer2DModel::from_pretrained(dir / "transformer", DType::bf16);
    std::vector<float> ids;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) ids.insert(ids.end(), {0.f, float(i), float(j)});
    const Tensor velocity =
        tr.forward(input({1, 16, 64}, 1), input({1, 8, 4096}, 2), input({1, 768}, 3),
                   from_vector({0.75f}, {1}, DType::bf16), from_vector(ids, {16, 3}, DType::bf16),
                   from_vector(std::vector<float>(24, 0.f), {8, 3}, DType::bf16), from_vector({3.5f}, {1}));
    expect_unit(velocity, "transformer velocity");
  }
  {
    const AutoencoderKL vae = AutoencoderKL::from_pretrained(dir / "vae", DType::bf16);
    // Latents of unit scale as the pipeline passes them to the decoder: latents / 0.3611.
    expect_unit(vae.decode(test::random_tensor({1, 16, 4, 4}, 4, DType::bf16, -1.7 / 0.3611, 1.7 / 0.3611)),
                "VAE image");
  }
}

// One run of the CLI (a dev folder at the real widths with 1+1 transformer blocks and 1 T5
// layer, 2 GB in bf16), checked every way in one test so that it is written once.
TEST_F(MakeRandomCli, WritesAFolderKilnLoadsAndRuns) {
  const fs::path dir = dir_ / "flux1-dev-1+1";
  const CliRun run = make_random((dir / "").string() + " --like flux1-dev --blocks 1+1 --t5-layers 1");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"flux1-dev-1+1"});  // no temporary left beside it
  {
    SCOPED_TRACE("the Hub's configs");
    expect_hub_configs(dir);
  }
  {
    SCOPED_TRACE("kiln's loaders read everything");
    expect_loads_everything(dir, run.output);
  }
  {
    SCOPED_TRACE("finite outputs of unit scale in bf16");
    expect_unit_scale_outputs(dir);
  }
  {
    SCOPED_TRACE("--seed 0 is the library's seed 0, byte for byte");
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    rw::write_random_component(dir_ / "library", flux1_vae(), DType::bf16, 0);
    omp_set_num_threads(threads);
    EXPECT_EQ(file_bytes(dir_ / "library" / "vae" / "diffusion_pytorch_model.safetensors"),
              file_bytes(dir / "vae" / "diffusion_pytorch_model.safetensors"));
  }
}

// Bad input fails before any work, naming the flag or path, and leaves no folder or temporary.
TEST_F(MakeRandomCli, BadInputFailsBeforeWriting) {
  const std::string out = (dir_ / "out").string();
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {out + " --like flux3-dev", "--like flux3-dev: expected flux1-schnell or flux1-dev"},
           {out, "needs --like"},
           {"--like flux1-dev", "needs the folder to write"},
           {out + " --like flux1-dev --blocks 19", "--blocks 19: expected D+S"},
           {out + " --like flux1-dev --blocks 1+2+3", "--blocks 1+2+3: expected D+S"},
           {out + " --like flux1-dev --blocks -1+2", "--blocks -1+2: expected D+S"},
           {out + " --like flux1-dev --blocks +2", "--blocks +2: expected D+S"},
           {out + " --like flux1-dev --t5-layers 0", "--t5-layers 0: flux1-dev needs at least 1 T5 layer (block 0 holds"},
           {out + " --like flux1-dev --blocks 1001+0", "--blocks 1001+0: at most 1000 blocks each"},
           {out + " --like flux1-dev --t5-layers 1001", "--t5-layers 1001: at most 1000 T5 layers"},
           {out + " --like flux1-dev --dtype f64", "--dtype f64: expected bf16, f16 or f32"},
           {out + " --like flux1-dev --seed x", "flag --seed expects an integer"},
           {out + " --like flux1-dev --shards 2", "unknown flag '--shards'"},
           {out + " --like flux1-dev --t5-layers 2 --t5-layers 3", "--t5-layers is given twice"},
       }) {
    const CliRun r = make_random(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("writing"), std::string::npos) << r.output;
  }
  EXPECT_EQ(entries(dir_), std::vector<std::string>{});

  // A folder with something in it is never written into; a file is not a folder.
  fs::create_directories(dir_ / "full");
  std::ofstream(dir_ / "full" / "keep.txt") << "mine";
  CliRun r = make_random((dir_ / "full").string() + " --like flux1-schnell --blocks 0+1 --t5-layers 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find((dir_ / "full").string() + " is not empty"), std::string::npos) << r.output;
  EXPECT_EQ(entries(dir_ / "full"), std::vector<std::string>{"keep.txt"});
  EXPECT_EQ(file_bytes(dir_ / "full" / "keep.txt"), "mine");
  r = make_random((dir_ / "full" / "keep.txt").string() + " --like flux1-schnell");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("keep.txt exists and is not a folder"), std::string::npos) << r.output;

  // More than the disk holds (1.9 TB: the most blocks make-random takes, in f32): refused before
  // writing, and the parents it created are gone again.
  r = make_random((dir_ / "new" / "deeper" / "huge").string() + " --like flux1-schnell --blocks 1000+1000 --dtype f32");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("needs"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("free"), std::string::npos) << r.output;
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"full"});
}

// A run that SIGTERM ends mid-write removes its temporary (as big as the model) and still dies of
// the signal; a temporary that a dead run left behind (SIGKILL, a crash) is removed by the next
// run. The waits are bounded polls for the temporary to appear, not sleeps standing in for timing.
TEST_F(MakeRandomCli, ASignalledRunRemovesItsTemporaryAndStaleOnesAreRemoved) {
  const pid_t dead = ::fork();  // a PID surely gone: a child that exited and was reaped
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ::waitpid(dead, nullptr, 0);
  const fs::path stale = dir_ / (".out.make-random." + std::to_string(dead));
  fs::create_directories(stale / "transformer");
  std::ofstream(stale / "transformer" / "part.safetensors") << "partial";

  const fs::path log = fs::temp_directory_path() / ("kiln_make_random_signal_" + std::to_string(::getpid()) + ".log");
  const pid_t pid = test::spawn_logged({KILN_CLI_PATH, "make-random", (dir_ / "out").string(), "--like", "flux1-dev",
                                        "--blocks", "1+1", "--t5-layers", "1"},
                                       log);
  ASSERT_GT(pid, 0);
  const fs::path temp = dir_ / (".out.make-random." + std::to_string(pid));
  std::error_code ec;
  const auto writing_weights = [&] {  // a weights file (or its temporary) has appeared in the temporary
    for (auto it = fs::recursive_directory_iterator(temp, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec))
      if (it->path().filename().string().find(".safetensors") != std::string::npos) return true;
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int status = 0;
  bool exited = false;
  while (!writing_weights() && std::chrono::steady_clock::now() < deadline &&
         !(exited = ::waitpid(pid, &status, WNOHANG) == pid))
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ASSERT_FALSE(exited) << "make-random ended before it was signalled:\n" << test::read_text_file(log);
  ASSERT_TRUE(writing_weights()) << "no weights in " << temp << " within 120 s\n" << test::read_text_file(log);
  EXPECT_FALSE(fs::exists(stale, ec)) << "the dead run's temporary is still there";
  ::kill(pid, SIGTERM);
  // Bounded: a cleanup that never ends is killed after 60 s and fails the test.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(exited = ::waitpid(pid, &status, WNOHANG) == pid) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (!exited) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  EXPECT_TRUE(exited) << test::read_text_file(log);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "status " << status << "\n"
                                                                  << test::read_text_file(log);
  EXPECT_EQ(entries(dir_), std::vector<std::string>{});  // no temporary, no stale one, no out
  fs::remove(log, ec);
}

// ---- the streaming writer and the sharding, on their own ----

class MakeRandomWriter : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_make_random_writer_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// A streamed file is save_safetensors' file byte for byte (same header, layout and rounding),
// for every float dtype, with a tensor larger than the writer's 16 MiB chunk.
TEST_F(MakeRandomWriter, StreamedFileEqualsSaveSafetensors) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<io::StreamedTensor> streamed;
    std::vector<std::pair<std::string, Tensor>> whole;
    const std::vector<std::pair<std::string, Shape>> shapes{{"big", {5, 1000, 1001}}, {"empty", {0, 3}}, {"s", {7}}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto& [name, shape] = shapes[i];
      const uint64_t key = rw::tensor_key(i, name);
      const rw::Init init = rw::Init::uniform(0.5);
      auto fill = [key, init](int64_t begin, int64_t count, float* dst) { rw::fill(init, key, begin, count, dst); };
      std::vector<float> values(size_t(numel(shape)));
      fill(0, numel(shape), values.data());
      streamed.push_back({name, dtype, shape, fill});
      whole.emplace_back(name, from_vector(values, shape, dtype));
    }
    const std::map<std::string, std::string> metadata{{"format", "pt"}};
    const uint64_t bytes = io::write_safetensors_streamed(dir_ / "streamed.safetensors", streamed, metadata);
    io::save_safetensors(dir_ / "whole.safetensors", whole, metadata);
    const std::string a = file_bytes(dir_ / "streamed.safetensors");
    EXPECT_EQ(a, file_bytes(dir_ / "whole.safetensors")) << dtype_name(dtype);
    EXPECT_EQ(bytes, a.size());
    EXPECT_EQ(io::streamed_file_bytes(streamed, metadata), a.size());
  }
}

// A failure while streaming (here the fill throws) leaves nothing at the path, and no temporary.
TEST_F(MakeRandomWriter, FailedWriteLeavesNoFile) {
  const std::vector<io::StreamedTensor> tensors{
      {"ok", DType::bf16, {1000}, [](int64_t, int64_t n, float* d) { std::fill(d, d + n, 1.f); }},
      {"bad", DType::bf16, {100000}, [](int64_t begin, int64_t, float*) {
         if (begin >= 50000) throw std::runtime_error("generator failed");
       }}};
  EXPECT_THROW(io::write_safetensors_streamed(dir_ / "x.safetensors", tensors), std::runtime_error);
  EXPECT_EQ(entries(dir_), std::vector<std::string>{});
  test::expect_error([&] { io::write_safetensors_streamed(dir_ / "y.safetensors", {tensors[0], tensors[0]}); },
                     {"y.safetensors", "tensor 'ok' given twice"});
  EXPECT_EQ(entries(dir_), std::vector<std::string>{});
}

// The same seed writes the same bytes whatever the thread count; another seed other values.
TEST_F(MakeRandomWriter, SameSeedSameBytesAnyThreadCount) {
  const rw::RandomComponent vae = flux1_vae();
  const int threads = omp_get_max_threads();
  for (const auto& [name, n, seed] : {std::tuple{"one", 1, 0}, std::tuple{"all", std::max(2, threads), 0},
                                      std::tuple{"seed1", std::max(2, threads), 1}}) {
    omp_set_num_threads(n);
    rw::write_random_component(dir_ / name, vae, DType::bf16, uint64_t(seed));
  }
  omp_set_num_threads(threads);
  const auto bytes = [&](const char* name) {
    return file_bytes(dir_ / name / "vae" / "diffusion_pytorch_model.safetensors");
  };
  const std::string one = bytes("one"), other = bytes("seed1");
  EXPECT_EQ(bytes("all"), one);
  ASSERT_EQ(other.size(), one.size());  // the same header: names, shapes, offsets
  size_t differ = 0;
  for (size_t i = 0; i < one.size(); ++i) differ += one[i] != other[i];
  EXPECT_GT(differ, one.size() / 2);  // the random tensors (most bytes) all changed
}

// Hugging Face's rule: a shard closes when the next tensor would pass the limit, and a tensor
// over the limit gets a shard of its own, placed before the one being filled.
TEST_F(MakeRandomWriter, ShardsSplitAsHuggingFaceDoes) {
  using Shards = std::vector<std::vector<size_t>>;
  EXPECT_EQ(io::split_into_shards({4, 4, 4}, 10), (Shards{{0, 1}, {2}}));
  EXPECT_EQ(io::split_into_shards({4, 6, 1}, 10), (Shards{{0, 1}, {2}}));
  EXPECT_EQ(io::split_into_shards({3, 20, 3, 3}, 10), (Shards{{1}, {0, 2, 3}}));
  EXPECT_EQ(io::split_into_shards({}, 10), (Shards{{}}));
  EXPECT_EQ(io::shard_file_name("model", 1, 12), "model-00002-of-00012.safetensors");

  // A VAE split at 40 MB: shards plus an index that kiln's loader follows to the same values.
  rw::RandomComponent vae = flux1_vae();
  vae.max_shard_bytes = 40'000'000;
  const rw::WrittenComponent w = rw::write_random_component(dir_, vae, DType::bf16, 0);
  ASSERT_EQ(w.files.size(), 1u + 5u + 1u) << testing::PrintToString(w.files);  // config, 5 shards, index
  EXPECT_EQ(w.files[1], "diffusion_pytorch_model-00001-of-00005.safetensors");
  EXPECT_EQ(w.files.back(), "diffusion_pytorch_model.safetensors.index.json");
  const nlohmann::json index = read_json(dir_ / "vae" / w.files.back());
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 2 * 83'819'683ull);
  EXPECT_EQ(index["weight_map"].size(), 244u);
  for (size_t s = 1; s + 1 < w.files.size(); ++s) EXPECT_LE(fs::file_size(dir_ / "vae" / w.files[s]), 40'100'000u);
  {
    nn::CheckpointAudit audit;
    AutoencoderKL::from_pretrained(dir_ / "vae", DType::bf16);
    EXPECT_EQ(audit.unused({}), std::vector<std::string>{});
  }
  const rw::WrittenComponent single =
      rw::write_random_component(dir_ / "single", flux1_vae(), DType::bf16, 0);
  const io::SafetensorsIndex sharded(dir_ / "vae"), one(dir_ / "single" / "vae");
  EXPECT_EQ(sharded.names(), one.names());
  for (const char* name :
       {"encoder.conv_in.weight", "decoder.up_blocks.1.resnets.2.conv2.weight", "decoder.conv_out.bias"})
    EXPECT_EQ(to_vector(sharded.load(name)), to_vector(one.load(name))) << name;
  EXPECT_EQ(single.files.size(), 2u);
}

}  // namespace
}  // namespace kiln
