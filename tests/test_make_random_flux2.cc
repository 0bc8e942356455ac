// kiln make-random --like flux2-dev|flux2-klein-4b|flux2-klein-9b: real-size FLUX.2 folders with
// deterministic random weights. At full depth the declared transformer and text encoder have every
// key and shape of spec flux2.md §2.1, §7.3 and §8 (typed here from the spec, independently of the
// tool), and the configs are the ones kiln's readers take for FLUX.2's. The CLI writes one
// flux2-klein-4b folder at the real widths with 1+1 transformer blocks and 2 text encoder layers
// (2.3 GB in bf16, once) that kiln's loaders read with no tensor left over and that generates an
// image (library and CLI). Every variant is also written at its real depths with narrow widths
// (1 head of 128 in the transformer, a 64-wide language model), so the default text_encoder_out_layers,
// the dev tokenizer and the Mistral3 key prefix are exercised, and the activations are checked to
// stay O(1) through all 40 / 36 text encoder layers and 56 / 25 / 32 transformer blocks. The
// streaming writer, sharding and seeding are shared with FLUX.1 and tested in test_make_random.cc.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "exec/host.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "models/flux2/flux2_transformer.h"
#include "models/llm/causal_lm_text_encoder.h"
#include "random_checkpoint/component_reads.h"
#include "random_checkpoint/like_recipe.h"
#include "random_checkpoint/random_folder.h"
#include "models/vae/autoencoder_kl.h"
#include "nn/weight_source.h"
#include "pipelines/flux2_pipeline.h"
#include "schedulers/flow_match_euler.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace rw = random_weights;

using Shapes = std::map<std::string, Shape>;

// The --like names of FLUX.2, typed here.
const std::vector<std::string> kLikes{"flux2-dev", "flux2-klein-4b", "flux2-klein-9b"};
bool is_dev(const std::string& like) { return like == "flux2-dev"; }

// ---- spec flux2.md §1.2, §2.1, §7.3, §8, typed from the spec ----

struct TransformerSpec {
  int64_t heads, joint, double_blocks, single_blocks;
  bool guidance;
};
TransformerSpec transformer_spec(const std::string& like) {
  if (like == "flux2-klein-4b") return {24, 7680, 5, 20, false};
  if (like == "flux2-klein-9b") return {32, 12288, 8, 24, false};
  EXPECT_EQ(like, "flux2-dev");
  return {48, 15360, 8, 48, true};
}

// Every tensor of Flux2Transformer2DModel: no biases, D = heads x 128, F = 3D.
Shapes flux2_transformer_shapes(const TransformerSpec& t) {
  const int64_t D = t.heads * 128, F = 3 * D;
  Shapes s{{"x_embedder.weight", {D, 128}},
           {"context_embedder.weight", {D, t.joint}},
           {"time_guidance_embed.timestep_embedder.linear_1.weight", {D, 256}},
           {"time_guidance_embed.timestep_embedder.linear_2.weight", {D, D}},
           {"double_stream_modulation_img.linear.weight", {6 * D, D}},
           {"double_stream_modulation_txt.linear.weight", {6 * D, D}},
           {"single_stream_modulation.linear.weight", {3 * D, D}},
           {"norm_out.linear.weight", {2 * D, D}},
           {"proj_out.weight", {128, D}}};
  if (t.guidance) {
    s["time_guidance_embed.guidance_embedder.linear_1.weight"] = {D, 256};
    s["time_guidance_embed.guidance_embedder.linear_2.weight"] = {D, D};
  }
  for (int64_t i = 0; i < t.double_blocks; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    for (const char* p : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"})
      s[b + "attn." + p + ".weight"] = {D, D};
    for (const char* p : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"}) s[b + "attn." + p + ".weight"] = {128};
    for (const char* ff : {"ff", "ff_context"}) {
      s[b + ff + ".linear_in.weight"] = {2 * F, D};
      s[b + ff + ".linear_out.weight"] = {D, F};
    }
  }
  for (int64_t j = 0; j < t.single_blocks; ++j) {
    const std::string b = "single_transformer_blocks." + std::to_string(j) + ".attn.";
    s[b + "to_qkv_mlp_proj.weight"] = {3 * D + 2 * F, D};
    s[b + "norm_q.weight"] = {128};
    s[b + "norm_k.weight"] = {128};
    s[b + "to_out.weight"] = {D, D + F};
  }
  return s;
}

struct LmSpec {
  std::string prefix;
  int64_t hidden, intermediate, vocab, layers;
  bool qk_norm;
};
LmSpec lm_spec(const std::string& like) {
  if (like == "flux2-klein-4b") return {"model.", 2560, 9728, 151936, 36, true};
  if (like == "flux2-klein-9b") return {"model.", 4096, 12288, 151936, 36, true};
  EXPECT_EQ(like, "flux2-dev");
  return {"model.language_model.", 5120, 32768, 131072, 40, false};
}

// The pipeline's default text_encoder_out_layers (§7.3): the language model's hidden states
// 10, 20, 30 (dev) or 9, 18, 27 (klein).
std::vector<int64_t> default_out_layers(const std::string& like) {
  return is_dev(like) ? std::vector<int64_t>{10, 20, 30} : std::vector<int64_t>{9, 18, 27};
}

// The language model's tensors (32 query heads and 8 KV heads of 128), without lm_head.
Shapes lm_shapes(const LmSpec& m) {
  const int64_t q = 32 * 128, kv = 8 * 128;
  Shapes s{{m.prefix + "embed_tokens.weight", {m.vocab, m.hidden}}, {m.prefix + "norm.weight", {m.hidden}}};
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string l = m.prefix + "layers." + std::to_string(i) + ".";
    s[l + "input_layernorm.weight"] = {m.hidden};
    s[l + "post_attention_layernorm.weight"] = {m.hidden};
    s[l + "self_attn.q_proj.weight"] = {q, m.hidden};
    s[l + "self_attn.k_proj.weight"] = {kv, m.hidden};
    s[l + "self_attn.v_proj.weight"] = {kv, m.hidden};
    s[l + "self_attn.o_proj.weight"] = {m.hidden, q};
    s[l + "mlp.gate_proj.weight"] = {m.intermediate, m.hidden};
    s[l + "mlp.up_proj.weight"] = {m.intermediate, m.hidden};
    s[l + "mlp.down_proj.weight"] = {m.hidden, m.intermediate};
    if (m.qk_norm) {
      s[l + "self_attn.q_norm.weight"] = {128};
      s[l + "self_attn.k_norm.weight"] = {128};
    }
  }
  return s;
}

Shapes declared_shapes(const rw::RandomComponent& c) {
  Shapes s;
  for (const rw::RandomTensor& t : c.tensors) EXPECT_TRUE(s.emplace(t.name, t.shape).second) << t.name << " twice";
  return s;
}

int64_t parameters(const Shapes& s) {
  int64_t n = 0;
  for (const auto& [name, shape] : s) n += numel(shape);
  return n;
}

// The folder --like `like` writes at the Hub's depths (bf16, seed 0).
rw::RandomLikeOptions options_for(const std::string& like) {
  rw::RandomLikeOptions o;
  o.like = like;
  return o;
}

TEST(MakeRandomFlux2Counts, TransformerAndTextEncoderHaveEveryKeyAndShapeOfTheSpec) {
  for (const std::string& v : kLikes) {
    SCOPED_TRACE(v);
    const std::vector<rw::RandomComponent> c = rw::like_components(options_for(v));
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c[0].folder, "text_encoder");
    EXPECT_EQ(c[1].folder, "transformer");
    EXPECT_EQ(c[2].folder, "vae");
    EXPECT_EQ(declared_shapes(c[1]), flux2_transformer_shapes(transformer_spec(v)));
    EXPECT_EQ(declared_shapes(c[0]), lm_shapes(lm_spec(v)));
  }
  // The parameter counts (FLUX.2-dev's transformer is 8 x 0.98 B + 48 x 0.49 B + 0.82 B of
  // embeddings and modulations; the language models are Mistral Small's 23.57 B less its 0.67 B
  // lm_head and vision tower, Qwen3-4B's 4.02 B (tied), Qwen3-8B's 8.19 B less its 0.62 B lm_head).
  const std::vector<int64_t> transformer{32'223'281'152, 3'875'544'576, 9'078'581'248},
      text_encoder{22'901'314'560, 4'022'468'096, 7'568'405'504};
  for (size_t i = 0; i < kLikes.size(); ++i) {
    const std::vector<rw::RandomComponent> c = rw::like_components(options_for(kLikes[i]));
    ASSERT_EQ(c.size(), 3u) << kLikes[i];
    EXPECT_EQ(c[1].parameters(), transformer[i]) << kLikes[i];
    EXPECT_EQ(c[0].parameters(), text_encoder[i]) << kLikes[i];
    EXPECT_EQ(parameters(flux2_transformer_shapes(transformer_spec(kLikes[i]))), transformer[i]);
    EXPECT_EQ(parameters(lm_shapes(lm_spec(kLikes[i]))), text_encoder[i]);
  }

  // Depths: the first blocks and layers of the real model.
  const rw::RandomLikeOptions o{"flux2-klein-9b", {{"--blocks", {2, 0}}, {"--text-encoder-layers", {3}}}};
  const std::vector<rw::RandomComponent> c = rw::like_components(o);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(declared_shapes(c[1]), flux2_transformer_shapes({32, 12288, 2, 0, false}));
  EXPECT_EQ(declared_shapes(c[0]), lm_shapes({"model.", 4096, 12288, 151936, 3, true}));
  EXPECT_EQ(c[0].config["num_hidden_layers"], 3);
  EXPECT_EQ(c[1].config["num_layers"], 2);
  EXPECT_EQ(c[1].config["num_single_layers"], 0);
}

// AutoencoderKLFlux2: the FLUX.1 VAE with 32 latent channels, quant_conv, post_quant_conv and
// the latent BatchNorm's buffers (num_batches_tracked int64, whatever the weights' dtype).
TEST(MakeRandomFlux2Counts, VaeIsAutoencoderKLFlux2) {
  const rw::RandomComponent vae = rw::like_component(options_for("flux2-dev"), "vae");
  const Shapes s = declared_shapes(vae);
  EXPECT_EQ(s.size(), 251u);  // FLUX.1's 244 + 2 convs x 2 + 3 buffers
  EXPECT_EQ(vae.parameters(), 84'046'372);
  EXPECT_EQ(s.at("encoder.conv_out.weight"), (Shape{64, 512, 3, 3}));
  EXPECT_EQ(s.at("decoder.conv_in.weight"), (Shape{512, 32, 3, 3}));
  EXPECT_EQ(s.at("quant_conv.weight"), (Shape{64, 64, 1, 1}));
  EXPECT_EQ(s.at("quant_conv.bias"), (Shape{64}));
  EXPECT_EQ(s.at("post_quant_conv.weight"), (Shape{32, 32, 1, 1}));
  EXPECT_EQ(s.at("bn.running_mean"), (Shape{128}));
  EXPECT_EQ(s.at("bn.running_var"), (Shape{128}));
  EXPECT_EQ(s.at("bn.num_batches_tracked"), (Shape{}));
  for (const io::StreamedTensor& t : rw::streamed_tensors(vae, DType::bf16, 0))
    EXPECT_EQ(t.dtype, t.name == "bn.num_batches_tracked" ? DType::i64 : DType::bf16) << t.name;
  // Every FLUX.2 checkpoint has this VAE; FLUX.1's and SD3's are unchanged.
  for (const char* v : {"flux2-klein-4b", "flux2-klein-9b"})
    EXPECT_EQ(declared_shapes(rw::like_component(options_for(v), "vae")), s) << v;
  for (const char* v : {"flux1-schnell", "flux1-dev", "sd3-medium", "sd3.5-medium"}) {
    const rw::RandomComponent other = rw::like_component(options_for(v), "vae");
    EXPECT_EQ(other.parameters(), 83'819'683) << v;
    EXPECT_EQ(other.tensors.size(), 244u) << v;
  }
}

// The whole folder at full depth, planned (not written): the files save_pretrained would shard
// into (10 GB Diffusers shards, 5 GB transformers shards) and their sizes in bf16.
TEST(MakeRandomFlux2Counts, FullSizeFilesAreShardedAsSavePretrainedDoes) {
  // {text_encoder, transformer, vae} files: config.json + shards (+ index when more than one).
  const std::map<std::string, std::array<size_t, 3>> files{
      {"flux2-dev", {12, 9, 2}}, {"flux2-klein-4b", {4, 2, 2}}, {"flux2-klein-9b", {6, 4, 2}}};
  for (const std::string& v : kLikes) {
    SCOPED_TRACE(v);
    const std::vector<rw::RandomComponent> c = rw::like_components(options_for(v));
    ASSERT_EQ(c.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const rw::WrittenComponent plan = rw::plan_random_component(c[i], DType::bf16);
      EXPECT_EQ(plan.files.size(), files.at(v)[i]) << c[i].folder;
      // Two bytes a parameter (one int64 of 8 in the VAE), plus headers, configs and the index.
      const uint64_t tensor_bytes = 2 * uint64_t(c[i].parameters()) + (i == 2 ? 6 : 0);
      EXPECT_GT(plan.bytes, tensor_bytes) << c[i].folder;
      EXPECT_LT(plan.bytes, tensor_bytes + 400 * c[i].tensors.size() + 4096) << c[i].folder;
    }
  }
}

// generated(c, name): the f32 values make-random writes for one tensor (seed 0), its first 4M at
// most (every element is drawn alike: the first 4M of a 671M embedding have its distribution).
std::vector<float> generated(const rw::RandomComponent& c, const std::string& name) {
  for (const io::StreamedTensor& t : rw::streamed_tensors(c, DType::f32, 0)) {
    if (t.name != name) continue;
    std::vector<float> v(size_t(std::min<int64_t>(numel(t.shape), int64_t(1) << 22)));
    t.fill(0, int64_t(v.size()), v.data());
    return v;
  }
  ADD_FAILURE() << c.folder << " has no tensor " << name;
  return {};
}

// The scales that keep a run finite: a weight mapping n inputs has standard deviation
// 1/sqrt(n), the last projection of a residual branch also 1/sqrt(branches) (dev's transformer:
// 2 x 8 + 48 = 64; Mistral's 2 x 40 = 80); norms are the identity, the BatchNorm's statistics
// mean 0 and variance 1. Tolerances as test_make_random.cc's (1% on the standard deviation).
TEST(MakeRandomFlux2Scales, WeightsHaveTheDeclaredScales) {
  // The scales of the full depth, on fewer blocks: written out below.
  const rw::RandomLikeOptions o{"flux2-dev", {{"--blocks", {1, 1}}, {"--text-encoder-layers", {1}}}};
  const std::vector<rw::RandomComponent> c = rw::like_components(o);
  ASSERT_EQ(c.size(), 3u);
  const auto check = [](const rw::RandomComponent& c, const std::string& name, double want_std) {
    const std::vector<float> v = generated(c, name);
    double sum = 0, sq = 0, largest = 0;
    for (float x : v) sum += x, sq += double(x) * x, largest = std::max(largest, double(std::fabs(x)));
    const double n = double(v.size()), mean = sum / n, std = std::sqrt(sq / n - mean * mean);
    EXPECT_NEAR(std / want_std, 1.0, 0.01) << name;
    EXPECT_LT(std::fabs(mean), 4 * want_std / std::sqrt(n)) << name;
    EXPECT_LE(largest, want_std * std::sqrt(3.0)) << name;
  };
  const double D = 6144, F = 18432, branches = 2 * 1 + 1;
  const rw::RandomComponent &te = c[0], &tr = c[1];
  check(tr, "transformer_blocks.0.attn.to_q.weight", 1 / std::sqrt(D));
  check(tr, "transformer_blocks.0.ff.linear_in.weight", 1 / std::sqrt(D));
  check(tr, "transformer_blocks.0.attn.to_out.0.weight", 1 / std::sqrt(D * branches));
  check(tr, "transformer_blocks.0.ff_context.linear_out.weight", 1 / std::sqrt(F * branches));
  check(tr, "single_transformer_blocks.0.attn.to_out.weight", 1 / std::sqrt((D + F) * branches));
  check(tr, "context_embedder.weight", 1 / std::sqrt(15360.0));
  check(tr, "time_guidance_embed.guidance_embedder.linear_1.weight", 1 / std::sqrt(256.0));
  check(tr, "double_stream_modulation_img.linear.weight", 1 / std::sqrt(D));
  check(te, "model.language_model.layers.0.self_attn.q_proj.weight", 1 / std::sqrt(5120.0));
  check(te, "model.language_model.layers.0.self_attn.o_proj.weight", 1 / std::sqrt(4096.0 * 2));
  check(te, "model.language_model.layers.0.mlp.down_proj.weight", 1 / std::sqrt(32768.0 * 2));
  check(te, "model.language_model.embed_tokens.weight", 1.0);
  const rw::RandomComponent full = rw::like_component(options_for("flux2-dev"), "transformer");
  check(full, "single_transformer_blocks.47.attn.to_out.weight", 1 / std::sqrt((D + F) * 64));
  for (const auto& [comp, name, value] :
       {std::tuple{&tr, "transformer_blocks.0.attn.norm_added_k.weight", 1.0f},
        std::tuple{&te, "model.language_model.norm.weight", 1.0f},
        std::tuple{&c[2], "bn.running_mean", 0.0f}, std::tuple{&c[2], "bn.running_var", 1.0f},
        std::tuple{&c[2], "bn.num_batches_tracked", 0.0f}})
    for (float x : generated(*comp, name)) ASSERT_EQ(x, value) << name;
}

// The configs are the ones kiln reads for FLUX.2 (every field it takes has the spec's value).
TEST(MakeRandomFlux2Counts, ConfigsReadAsTheSpecSays) {
  for (const std::string& v : kLikes) {
    SCOPED_TRACE(v);
    const bool klein = !is_dev(v);
    const std::vector<rw::RandomComponent> c = rw::like_components(options_for(v));
    ASSERT_EQ(c.size(), 3u);

    const Flux2TransformerConfig t =
        Flux2TransformerConfig::from_json(io::JsonConfig::from_string(c[1].config.dump(), "transformer"));
    const TransformerSpec ts = transformer_spec(v);
    EXPECT_EQ(t.num_layers, ts.double_blocks);
    EXPECT_EQ(t.num_single_layers, ts.single_blocks);
    EXPECT_EQ(t.num_attention_heads, ts.heads);
    EXPECT_EQ(t.joint_attention_dim, ts.joint);
    EXPECT_EQ(t.guidance_embeds, ts.guidance);
    EXPECT_EQ(t.in_channels, 128);
    EXPECT_EQ(t.out_features(), 128);
    EXPECT_EQ(t.mlp_hidden(), 3 * ts.heads * 128);
    EXPECT_EQ(t.axes_dims_rope, (std::vector<int64_t>{32, 32, 32, 32}));
    EXPECT_EQ(t.rope_theta, 2000);
    // dev's file has no guidance_embeds (it predates the field); klein's says false.
    EXPECT_EQ(c[1].config.contains("guidance_embeds"), klein);

    const DecoderLMConfig lm =
        DecoderLMConfig::from_json(io::JsonConfig::from_string(c[0].config.dump(), "text_encoder"));
    const LmSpec ls = lm_spec(v);
    EXPECT_EQ(lm.model_type, klein ? "qwen3" : "mistral");
    EXPECT_EQ(lm.checkpoint_model_type, klein ? "qwen3" : "mistral3");
    EXPECT_EQ(lm.hidden_size, ls.hidden);
    EXPECT_EQ(lm.intermediate_size, ls.intermediate);
    EXPECT_EQ(lm.vocab_size, ls.vocab);
    EXPECT_EQ(lm.num_hidden_layers, ls.layers);
    EXPECT_EQ(lm.num_attention_heads, 32);
    EXPECT_EQ(lm.num_key_value_heads, 8);
    EXPECT_EQ(lm.head_dim, 128);
    EXPECT_EQ(lm.rms_norm_eps, klein ? 1e-6 : 1e-5);
    EXPECT_EQ(lm.rope_theta, klein ? 1e6 : 1e9);
    EXPECT_FALSE(lm.sliding_window.has_value());
    EXPECT_EQ(lm.hidden_act, "silu");
    // 3 hidden states per token make the transformer's joint_attention_dim.
    EXPECT_EQ(3 * lm.hidden_size, t.joint_attention_dim);
    if (klein) {
      EXPECT_EQ(c[0].config["tie_word_embeddings"], v == "flux2-klein-4b");
    } else {
      EXPECT_EQ(c[0].config["architectures"], nlohmann::json::array({"Mistral3ForConditionalGeneration"}));
      EXPECT_EQ(c[0].config["vision_config"]["model_type"], "pixtral");
    }

    const VaeConfig vae = VaeConfig::from_json(io::JsonConfig::from_string(c[2].config.dump(), "vae"));
    EXPECT_TRUE(vae.has_latent_batch_norm());
    EXPECT_EQ(vae.latent_channels, 32);
    EXPECT_EQ(vae.batch_norm_channels(), 128);
    EXPECT_TRUE(vae.use_quant_conv);
    EXPECT_TRUE(vae.use_post_quant_conv);
    EXPECT_EQ(vae.batch_norm_eps, 1e-4);

    const nlohmann::json index = rw::like_recipe(v).hub_json("model_index.json");
    EXPECT_EQ(index["_class_name"], klein ? "Flux2KleinPipeline" : "Flux2Pipeline");
    EXPECT_EQ(index.value("is_distilled", false), klein);
    EXPECT_EQ(index["text_encoder"][1], klein ? "Qwen3ForCausalLM" : "Mistral3ForConditionalGeneration");
    EXPECT_EQ(index["vae"][1], "AutoencoderKLFlux2");
  }
}

// ---- writing, loading and running ----

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun run_cli(const std::string& args) {
  CliRun r;
  FILE* p = ::popen((std::string(KILN_CLI_PATH) + " " + args + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf{};
  while (p && std::fgets(buf.data(), int(buf.size()), p)) r.output += buf.data();
  const int status = p ? ::pclose(p) : -1;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// RAM (/dev/shm) when it is there with room, else the temporary folder (as test_make_random.cc).
fs::path scratch_root() {
  std::error_code ec;
  const fs::space_info shm = fs::space("/dev/shm", ec);
  return !ec && fs::is_directory("/dev/shm") && shm.available > (uint64_t(6) << 30) ? fs::path("/dev/shm")
                                                                                     : fs::temp_directory_path();
}

class MakeRandomFlux2 : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_root() / ("kiln_make_random_flux2_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// The bundled tokenizers make-random copies (typed here: the FLUX.2 fixtures).
fs::path tokenizers_of(const std::string& like) {
  return fs::path(KILN_FIXTURES_DIR) / (is_dev(like) ? "flux2_tiny" : "flux2_klein_tiny") / "pipeline";
}

// A component made narrow (transformer 1 head of 128; language model 64 wide with 4 heads of 16,
// 2 KV heads and MLP 128; depths and vocabulary kept) by editing its config, the tensors
// rebuilt from it. Returns false for a component left as it is (the VAE).
bool narrow(rw::RandomComponent& c) {
  if (c.folder == "text_encoder") {
    // Mistral3 keeps its language model's fields in text_config; Qwen3 at the top.
    nlohmann::json& lm = c.config.contains("text_config") ? c.config["text_config"] : c.config;
    lm["hidden_size"] = 64;
    lm["intermediate_size"] = 128;
    lm["num_attention_heads"] = 4;
    lm["num_key_value_heads"] = 2;
    lm["head_dim"] = 16;
  } else if (c.folder == "transformer") {
    c.config["num_attention_heads"] = 1;
    c.config["joint_attention_dim"] = 3 * 64;
  } else {
    return false;
  }
  c.tensors = rw::component_tensors(c.folder, c.config);
  return true;
}

// Root mean square of a finite tensor; fails on a non-finite value.
double rms(const Tensor& t, const std::string& what) {
  double sq = 0;
  const std::vector<float> v = to_vector(t);
  for (float x : v) {
    if (!std::isfinite(x)) {
      ADD_FAILURE() << what << ": non-finite value";
      return NAN;
    }
    sq += double(x) * x;
  }
  return std::sqrt(sq / double(v.size()));
}

// O(1) as the tool promises: root mean square in [1/4, 4].
void expect_unit(const Tensor& t, const std::string& what) {
  const double r = rms(t, what);
  EXPECT_GT(r, 0.25) << what;
  EXPECT_LT(r, 4.0) << what;
}

// The transformer's velocity at a 4x4 latent grid and 8 text tokens of unit scale.
Tensor velocity(const Flux2Transformer2DModel& tr) {
  const int64_t joint = tr.config().joint_attention_dim;
  std::vector<int64_t> img, txt;
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 4; ++j) img.insert(img.end(), {0, i, j, 0});
  for (int64_t l = 0; l < 8; ++l) txt.insert(txt.end(), {0, 0, 0, l});
  std::optional<Tensor> guidance;
  if (tr.config().guidance_embeds) guidance = from_vector({4.f}, {1});
  return tr.forward(test::random_tensor({1, 16, 128}, 1, DType::bf16, -1.7, 1.7),
                    test::random_tensor({1, 8, joint}, 2, DType::bf16, -1.7, 1.7), from_vector({0.75f}, {1}),
                    from_ints(img, {16, 4}), from_ints(txt, {8, 4}), guidance);
}

// Every variant at its real depths, narrowed (transformer 1 head of 128, language model 64 wide with
// 4 heads of 16 and MLP 128; real vocabulary, real VAE), through the library: kiln's
// DiffusionPipeline picks the class model_index.json names and loads it with the default
// text_encoder_out_layers and nothing left over (strict); the prompt embeddings (the language
// model's layers 10/20/30 or 9/18/27) and the velocity after all transformer blocks are O(1) in
// bf16; a 64x64 image is generated.
TEST_F(MakeRandomFlux2, EveryVariantAtRealDepthLoadsAndRunsNarrowed) {
  for (const std::string& v : kLikes) {
    SCOPED_TRACE(v);
    rw::RandomFolderContents contents = rw::like_contents(options_for(v), KILN_FIXTURES_DIR);
    int narrowed = 0;
    for (rw::RandomComponent& c : contents.components) narrowed += narrow(c) ? 1 : 0;
    ASSERT_EQ(narrowed, 2);
    const fs::path dir = dir_ / v;
    rw::write_random_folder(dir, contents);

    PipelineOptions po;
    po.strict = true;
    const std::unique_ptr<DiffusionPipeline> loaded = DiffusionPipeline::from_pretrained(dir, po);
    auto* pipe = dynamic_cast<Flux2Pipeline*>(loaded.get());
    ASSERT_NE(pipe, nullptr);
    EXPECT_STREQ(pipe->class_name(), is_dev(v) ? "Flux2Pipeline" : "Flux2KleinPipeline");
    EXPECT_TRUE(pipe->is_distilled());
    EXPECT_EQ(pipe->default_text_encoder_out_layers(), default_out_layers(v));
    // make-random's own idea of them (its note on shallower text encoders) is the pipeline's.
    EXPECT_EQ(rw::like_recipe(v).text_encoder_out_layers, default_out_layers(v));
    EXPECT_EQ(pipe->transformer().config().num_single_layers, transformer_spec(v).single_blocks);
    EXPECT_EQ(pipe->transformer().dtype(), DType::bf16);

    const Flux2Pipeline::EncodedPrompt e =
        pipe->encode_prompt("a red fox in the snow", 64, default_out_layers(v));
    EXPECT_EQ(e.prompt_embeds.shape(), (Shape{1, 64, 3 * 64}));
    EXPECT_GT(std::count(e.attention_mask.begin(), e.attention_mask.end(), 1), 5);
    expect_unit(e.prompt_embeds, "prompt embeddings");
    expect_unit(velocity(pipe->transformer()), "velocity");

    PipelineCallArgs a;
    a.prompt = "a red fox in the snow";
    a.height = a.width = 64;
    a.num_inference_steps = 1;
    a.max_sequence_length = 64;
    a.on_warning = [](const std::string&) {};  // klein: guidance_scale is ignored (distilled)
    const PipelineOutput out = (*loaded)(a);
    EXPECT_EQ(out.height, 64);
    EXPECT_EQ(out.image.size(), 64u * 64u * 3u);
    expect_unit(out.latents, "final latents");
    const auto [lo, hi] = std::minmax_element(out.image.begin(), out.image.end());
    EXPECT_GT(int(*hi) - int(*lo), 32) << "a flat image";
    fs::remove_all(dir);
  }
}

// The CLI's klein-4b folder: the configs of §1, typed here independently of the tool, with the
// depths replaced; the bundled klein tokenizer, byte for byte.
void expect_klein_4b_configs(const fs::path& dir) {
  nlohmann::json index = read_json(dir / "model_index.json");
  index.erase("_diffusers_version");
  EXPECT_EQ(index, nlohmann::json::parse(R"({
    "_class_name": "Flux2KleinPipeline", "is_distilled": true,
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "Qwen3ForCausalLM"], "tokenizer": ["transformers", "Qwen2TokenizerFast"],
    "transformer": ["diffusers", "Flux2Transformer2DModel"], "vae": ["diffusers", "AutoencoderKLFlux2"]})"));
  nlohmann::json scheduler = read_json(dir / "scheduler" / "scheduler_config.json");
  scheduler.erase("_diffusers_version");
  EXPECT_EQ(scheduler, nlohmann::json::parse(R"({
    "_class_name": "FlowMatchEulerDiscreteScheduler", "base_image_seq_len": 256, "base_shift": 0.5,
    "invert_sigmas": false, "max_image_seq_len": 4096, "max_shift": 1.15, "num_train_timesteps": 1000,
    "shift": 3.0, "shift_terminal": null, "stochastic_sampling": false, "time_shift_type": "exponential",
    "use_beta_sigmas": false, "use_dynamic_shifting": true, "use_exponential_sigmas": false,
    "use_karras_sigmas": false})"));
  const FlowMatchEulerConfig sc = FlowMatchEulerConfig::load(dir / "scheduler" / "scheduler_config.json");
  EXPECT_TRUE(sc.use_dynamic_shifting);
  EXPECT_EQ(sc.shift, 3.0);
  nlohmann::json transformer = read_json(dir / "transformer" / "config.json");
  transformer.erase("_diffusers_version");
  EXPECT_EQ(transformer, nlohmann::json::parse(R"({
    "_class_name": "Flux2Transformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [32, 32, 32, 32],
    "eps": 1e-06, "guidance_embeds": false, "in_channels": 128, "joint_attention_dim": 7680, "mlp_ratio": 3.0,
    "num_attention_heads": 24, "num_layers": 1, "num_single_layers": 1, "out_channels": null, "patch_size": 1,
    "rope_theta": 2000, "timestep_guidance_channels": 256})"));
  nlohmann::json vae = read_json(dir / "vae" / "config.json");
  vae.erase("_diffusers_version");
  EXPECT_EQ(vae, nlohmann::json::parse(R"({
    "_class_name": "AutoencoderKLFlux2", "act_fn": "silu", "batch_norm_eps": 0.0001, "batch_norm_momentum": 0.1,
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D", "DownEncoderBlock2D"],
    "force_upcast": true, "in_channels": 3, "latent_channels": 32, "layers_per_block": 2,
    "mid_block_add_attention": true, "norm_num_groups": 32, "out_channels": 3, "patch_size": [2, 2],
    "sample_size": 1024, "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D", "UpDecoderBlock2D",
    "UpDecoderBlock2D"], "use_post_quant_conv": true, "use_quant_conv": true})"));
  const nlohmann::json te = read_json(dir / "text_encoder" / "config.json");
  EXPECT_EQ(te["architectures"], nlohmann::json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(te["model_type"], "qwen3");
  EXPECT_EQ(te["num_hidden_layers"], 2);
  EXPECT_EQ(te["hidden_size"], 2560);
  EXPECT_EQ(te["intermediate_size"], 9728);
  EXPECT_EQ(te["num_attention_heads"], 32);
  EXPECT_EQ(te["num_key_value_heads"], 8);
  EXPECT_EQ(te["head_dim"], 128);
  EXPECT_EQ(te["rms_norm_eps"], 1e-6);
  EXPECT_EQ(te["rope_theta"], 1e6);
  EXPECT_EQ(te["vocab_size"], 151936);
  EXPECT_EQ(te["tie_word_embeddings"], true);
  EXPECT_EQ(te["torch_dtype"], "bfloat16");

  const fs::path bundled = tokenizers_of("flux2-klein-4b") / "tokenizer";
  EXPECT_EQ(entries(dir / "tokenizer"), entries(bundled));
  for (const auto& e : fs::directory_iterator(bundled))
    EXPECT_EQ(file_bytes(dir / "tokenizer" / e.path().filename()), file_bytes(e.path())) << e.path();
}

// Every tensor of §2.1 / §8 / §4 for the depths written, in bf16 (num_batches_tracked int64 0);
// kiln's loaders read everything but what they skip on purpose.
void expect_klein_4b_weights(const fs::path& dir) {
  const auto written = [](const fs::path& component, const std::string& skip = "") {
    const io::SafetensorsIndex index(component);
    Shapes s;
    for (const std::string& name : index.names()) {
      const io::TensorInfo info = index.info(name);
      if (name != skip) {
        EXPECT_EQ(info.dtype_string, "BF16") << name;
      }
      s[name] = info.shape;
    }
    return s;
  };
  EXPECT_EQ(written(dir / "transformer"), flux2_transformer_shapes({24, 7680, 1, 1, false}));
  EXPECT_EQ(written(dir / "text_encoder"), lm_shapes({"model.", 2560, 9728, 151936, 2, true}));
  const Shapes vae = written(dir / "vae", "bn.num_batches_tracked");
  EXPECT_EQ(vae, declared_shapes(rw::like_component(options_for("flux2-klein-4b"), "vae")));
  const io::SafetensorsIndex vae_index(dir / "vae");
  EXPECT_EQ(vae_index.info("bn.num_batches_tracked").dtype_string, "I64");
  EXPECT_EQ(to_vector(vae_index.load("bn.num_batches_tracked")), std::vector<float>{0.f});
  EXPECT_EQ(to_vector(vae_index.load("bn.running_var", DType::f32)), std::vector<float>(128, 1.f));

  const auto unused = [](const std::vector<std::string>& skipped, const auto& load) {
    nn::CheckpointAudit audit;
    load();
    return audit.unused(skipped);
  };
  const std::vector<std::string> none;
  EXPECT_EQ(unused({}, [&] { CausalLMTextEncoder::from_pretrained(dir / "text_encoder", DType::bf16); }), none);
  EXPECT_EQ(unused({}, [&] { Flux2Transformer2DModel::from_pretrained(dir / "transformer", DType::bf16); }), none);
  EXPECT_EQ(unused(AutoencoderKL::checkpoint_keys_not_loaded(),
                   [&] { AutoencoderKL::from_pretrained(dir / "vae", DType::bf16); }),
            none);
  const CausalLMTextEncoder te = CausalLMTextEncoder::from_pretrained(dir / "text_encoder", DType::bf16);
  EXPECT_EQ(te.key_prefix(), "model.");
  EXPECT_EQ(te.num_layers_loaded(), 2);
  EXPECT_TRUE(te.has_final_norm());
  expect_unit(te.hidden_states(from_ints({785, 2518, 38835, 304, 279, 11794}, {1, 6}), from_ints({1, 1, 1, 1, 1, 1},
                                                                                                   {1, 6}),
                               {1, 2})[0],
              "Qwen3-4B layer 0's output");
  expect_unit(velocity(Flux2Transformer2DModel::from_pretrained(dir / "transformer", DType::bf16)),
              "klein-4b velocity");
}

// One run of the CLI (flux2-klein-4b at the real widths, 1+1 transformer blocks, 2 text encoder
// layers, 2.3 GB in bf16), checked every way in one test so that it is written once; then
// generated from, by the library and by kiln generate, with the hidden states 0, 1, 2.
TEST_F(MakeRandomFlux2, WritesAKlein4bFolderKilnLoadsAndRuns) {
  const fs::path dir = dir_ / "klein4b-1+1";
  const CliRun run =
      run_cli("make-random " + dir.string() + " --like flux2-klein-4b --blocks 1+1 --text-encoder-layers 2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"klein4b-1+1"});  // no temporary left beside it
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"model_index.json", "scheduler", "text_encoder", "tokenizer",
                                                    "transformer", "vae"}));
  EXPECT_NE(run.output.find("flux2-klein-4b folder (1+1 transformer blocks, 2 text encoder layers, bf16, seed 0)"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("default text_encoder_out_layers (9,18,27) need 27 text encoder layers"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("--text-encoder-out-layers 0,1,2"), std::string::npos) << run.output;
  for (const char* line : {"text_encoder", "transformer", "vae"})
    EXPECT_NE(run.output.find(std::string("  ") + line + " "), std::string::npos) << line << "\n" << run.output;
  // 590,820,352 + 563,086,080 + 84,046,372 parameters.
  EXPECT_NE(run.output.find("1,237,952,804 parameters"), std::string::npos) << run.output;
  {
    SCOPED_TRACE("configs and tokenizer");
    expect_klein_4b_configs(dir);
  }
  {
    SCOPED_TRACE("weights: keys, shapes, dtypes; kiln's loaders read everything");
    expect_klein_4b_weights(dir);
  }
  {
    SCOPED_TRACE("the library generates from it");
    PipelineOptions po;
    po.strict = true;
    po.text_encoder_out_layers = {0, 1, 2};
    const Flux2KleinPipeline pipe = Flux2KleinPipeline::from_pretrained(dir, po);
    PipelineCallArgs a;
    a.prompt = "a red fox in the snow";
    a.height = a.width = 64;
    a.num_inference_steps = 1;
    a.max_sequence_length = 32;
    a.on_warning = [](const std::string&) {};
    const PipelineOutput out = pipe(a);
    expect_unit(out.latents, "final latents");
    EXPECT_EQ(out.image.size(), 64u * 64u * 3u);
  }
  {
    SCOPED_TRACE("kiln generate runs it");
    const fs::path png = dir_ / "klein.png";
    const CliRun gen = run_cli("generate --model " + dir.string() +
                               " --prompt 'a red fox' --steps 1 --height 64 --width 64 --max-sequence-length 32 "
                               "--text-encoder-out-layers 0,1,2 --strict --out " +
                               png.string());
    EXPECT_EQ(gen.exit_code, 0) << gen.output;
    EXPECT_TRUE(fs::is_regular_file(png)) << gen.output;
    // Without the out layers, the default ones need 27 layers: a clear error.
    const CliRun deep = run_cli("generate --model " + dir.string() + " --prompt 'a red fox' --steps 1 --height 64 "
                                "--width 64 --out " + png.string());
    EXPECT_NE(deep.exit_code, 0) << deep.output;
    EXPECT_NE(deep.output.find("text_encoder_out_layers index) is 27"), std::string::npos) << deep.output;
  }
}

// Bad input fails before any work, naming the flag; the help names the FLUX.2 values.
TEST_F(MakeRandomFlux2, BadInputFailsBeforeWriting) {
  const std::string out = (dir_ / "out").string();
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {out + " --like flux2-pro", "flux2-dev, flux2-klein-4b or flux2-klein-9b (FLUX.2)"},
           {out + " --like flux2-dev --blocks 8", "--blocks 8: expected D+S"},
           {out + " --like flux2-klein-4b --t5-layers 2",
            "--t5-layers: flux2-klein-4b has no such depth (its depths are --blocks, --text-encoder-layers)"},
           {out + " --like flux1-dev --text-encoder-layers 2",
            "--text-encoder-layers: flux1-dev has no such depth (its depths are --blocks, --t5-layers)"},
           {out + " --like flux2-klein-9b --text-encoder-layers 0",
            "--text-encoder-layers 0: flux2-klein-9b needs at least 1 text encoder layer"},
           {out + " --like flux2-dev --dtype i64", "--dtype i64: expected bf16, f16 or f32"},
       }) {
    const CliRun r = run_cli("make-random " + args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("writing"), std::string::npos) << r.output;
  }
  EXPECT_EQ(entries(dir_), std::vector<std::string>{});
  // The library refuses a missing tokenizer folder before writing anything.
  test::expect_error([&] { rw::write_random_folder(out, rw::like_contents(options_for("flux2-dev"), dir_ / "none")); },
                     {"tokenizer folder", "none/flux2_tiny/pipeline/tokenizer", "is missing"});
  // And depths a FLUX.2 folder cannot have.
  test::expect_error([&] { rw::like_components({"flux2-klein-4b", {{"--t5-layers", {2}}}}); },
                     {"--t5-layers", "flux2-klein-4b has no such depth"});
  test::expect_error([&] { rw::like_components({"flux2-klein-9b", {{"--text-encoder-layers", {0}}}}); },
                     {"flux2-klein-9b needs at least 1 text encoder layer"});
  EXPECT_EQ(entries(dir_), std::vector<std::string>{});

  const CliRun help = run_cli("make-random --help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* s : {"flux2-dev|flux2-klein-4b|flux2-klein-9b", "--text-encoder-layers", "8+48 (flux2-dev)"})
    EXPECT_NE(help.output.find(s), std::string::npos) << s << "\n" << help.output;
}

}  // namespace
}  // namespace kiln
