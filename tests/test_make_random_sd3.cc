// kiln make-random --like sd3-medium|sd3.5-medium: real-size Stable Diffusion 3 / 3.5 Medium
// folders with deterministic random weights. The declared transformer has, at full depth, every
// key and shape of spec sd3.md §5.1 (typed here from the spec, independently of the tool) and the
// Hub's file sizes; the positional table follows §5.3's sincos formula. The CLI writes one
// sd3.5-medium folder at the real widths with 2 transformer blocks and 1 T5 layer (~3.1 GB in
// bf16, once, in one test) whose configs are SD3's, which kiln's loaders read with no tensor left
// over, and whose transformer and text encoders give finite outputs in bf16. The streaming writer,
// sharding and seeding are shared with FLUX.1 and tested in test_make_random.cc.
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "io/safetensors_shards.h"
#include "models/clip/clip_text_model.h"
#include "random_checkpoint/like_recipe.h"
#include "models/sd3/sd3_transformer.h"
#include "models/t5/t5_encoder.h"
#include "models/vae/autoencoder_kl.h"
#include "nn/weight_source.h"
#include "test_util.h"
#include "tokenizers/clip_tokenizer.h"
#include "tokenizers/t5_tokenizer.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace rw = random_weights;

using Shapes = std::map<std::string, Shape>;

constexpr int64_t D = 1536;  // 24 heads x 64

// ---- spec sd3.md §5.1, typed from the spec ----

// Every tensor of SD3Transformer2DModel with `n` blocks: 3.5 Medium (dual attention in blocks
// 0..12 below n, QK RMSNorm, M = 384) or 3.0 Medium (M = 192). The last block is context_pre_only.
Shapes sd3_transformer_shapes(bool v35, int64_t n) {
  Shapes s;
  const auto linear = [&](const std::string& p, int64_t in, int64_t out) {
    s[p + ".weight"] = {out, in};
    s[p + ".bias"] = {out};
  };
  const int64_t M = v35 ? 384 : 192;
  s["pos_embed.proj.weight"] = {D, 16, 2, 2};
  s["pos_embed.proj.bias"] = {D};
  s["pos_embed.pos_embed"] = {1, M * M, D};
  linear("time_text_embed.timestep_embedder.linear_1", 256, D);
  linear("time_text_embed.timestep_embedder.linear_2", D, D);
  linear("time_text_embed.text_embedder.linear_1", 2048, D);
  linear("time_text_embed.text_embedder.linear_2", D, D);
  linear("context_embedder", 4096, D);
  linear("norm_out.linear", D, 2 * D);
  linear("proj_out", D, 64);
  for (int64_t i = 0; i < n; ++i) {
    const std::string b = "transformer_blocks." + std::to_string(i) + ".";
    const bool dual = v35 && i <= 12, last = i == n - 1;
    linear(b + "norm1.linear", D, (dual ? 9 : 6) * D);
    linear(b + "norm1_context.linear", D, (last ? 2 : 6) * D);
    for (const char* p : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0"})
      linear(b + "attn." + p, D, D);
    if (!last) linear(b + "attn.to_add_out", D, D);
    if (v35)
      for (const char* p : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"}) s[b + "attn." + p + ".weight"] = {64};
    if (dual) {
      for (const char* p : {"to_q", "to_k", "to_v", "to_out.0"}) linear(b + "attn2." + p, D, D);
      if (v35)
        for (const char* p : {"norm_q", "norm_k"}) s[b + "attn2." + p + ".weight"] = {64};
    }
    linear(b + "ff.net.0.proj", D, 4 * D);
    linear(b + "ff.net.2", 4 * D, D);
    if (!last) {
      linear(b + "ff_context.net.0.proj", D, 4 * D);
      linear(b + "ff_context.net.2", 4 * D, D);
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

// The folder --like `like` writes, with `blocks` transformer blocks (0: the Hub's 24).
rw::RandomLikeOptions options_for(const std::string& like, int64_t blocks = 0) {
  rw::RandomLikeOptions o;
  o.like = like;
  if (blocks > 0) o.depths["--blocks"] = {blocks};
  return o;
}

rw::RandomComponent transformer(const std::string& like, int64_t blocks = 0) {
  return rw::like_component(options_for(like, blocks), "transformer");
}

// The tensors of `prefix` (a block), names relative to it.
Shapes block(const Shapes& s, const std::string& prefix) {
  Shapes out;
  for (const auto& [name, shape] : s)
    if (name.starts_with(prefix)) out[name.substr(prefix.size())] = shape;
  return out;
}

TEST(MakeRandomSd3Counts, TransformerHasEveryKeyAndShapeOfTheSpec) {
  for (const bool v35 : {true, false}) {
    const std::string like = v35 ? "sd3.5-medium" : "sd3-medium";
    SCOPED_TRACE(like);
    const Shapes declared = declared_shapes(transformer(like));
    EXPECT_EQ(declared, sd3_transformer_shapes(v35, 24));
    // The Hub's transformer files: 4.94 GB (3.5 Medium) and 4.17 GB (3.0 Medium) in 16 bits.
    EXPECT_EQ(parameters(declared), v35 ? 2'469'663'936 : 2'084'951'104);
    EXPECT_EQ(declared.at("pos_embed.pos_embed"), (Shape{1, v35 ? 147456 : 36864, D}));
  }
  // The three block shapes of 3.5 Medium, spelled out: dual (0-12), plain (13-22), last (23).
  const Shapes full = declared_shapes(transformer("sd3.5-medium"));
  const Shapes dual = block(full, "transformer_blocks.0."), plain = block(full, "transformer_blocks.13."),
               last = block(full, "transformer_blocks.23.");
  EXPECT_EQ(dual, block(full, "transformer_blocks.12."));
  EXPECT_EQ(plain, block(full, "transformer_blocks.22."));
  EXPECT_EQ(dual.at("norm1.linear.weight"), (Shape{9 * D, D}));
  EXPECT_EQ(dual.at("attn2.to_out.0.weight"), (Shape{D, D}));
  EXPECT_EQ(dual.at("attn2.norm_k.weight"), (Shape{64}));
  EXPECT_EQ(plain.at("norm1.linear.weight"), (Shape{6 * D, D}));
  EXPECT_EQ(plain.count("attn2.to_q.weight"), 0u);
  EXPECT_EQ(plain.at("norm1_context.linear.weight"), (Shape{6 * D, D}));
  EXPECT_EQ(plain.at("attn.to_add_out.weight"), (Shape{D, D}));
  EXPECT_EQ(plain.at("ff_context.net.2.weight"), (Shape{D, 4 * D}));
  EXPECT_EQ(last.at("norm1_context.linear.weight"), (Shape{2 * D, D}));
  EXPECT_EQ(last.at("norm1_context.linear.bias"), (Shape{2 * D}));
  EXPECT_EQ(last.at("attn.add_q_proj.weight"), (Shape{D, D}));
  EXPECT_EQ(last.count("attn.to_add_out.weight"), 0u);
  EXPECT_EQ(last.count("ff_context.net.0.proj.weight"), 0u);
  EXPECT_EQ(last.at("attn.norm_added_q.weight"), (Shape{64}));
  EXPECT_EQ(dual.size(), 42u);  // plain + attn2 (4 linears, 2 norms)
  EXPECT_EQ(plain.size(), 32u);  // 2 modulations, 8 attention linears, 4 norms, 2 feed-forwards
  EXPECT_EQ(last.size(), 26u);   // no to_add_out, no ff_context

  // Fewer blocks: the first n, the last one context_pre_only; 3.5's dual blocks those below 13.
  const rw::RandomComponent two = transformer("sd3.5-medium", 2), three = transformer("sd3-medium", 3);
  EXPECT_EQ(declared_shapes(two), sd3_transformer_shapes(true, 2));
  EXPECT_EQ(declared_shapes(three), sd3_transformer_shapes(false, 3));
  EXPECT_EQ(two.config["num_layers"], 2);
  EXPECT_EQ(three.config["num_layers"], 3);
  EXPECT_EQ(two.config["dual_attention_layers"], nlohmann::json::array({0, 1}));
  EXPECT_EQ(transformer("sd3.5-medium").config["dual_attention_layers"],
            nlohmann::json::array({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(transformer("sd3.5-medium", 20).config["dual_attention_layers"].size(), 13u);
  EXPECT_FALSE(three.config.contains("dual_attention_layers"));
  EXPECT_FALSE(transformer("sd3-medium").config.contains("dual_attention_layers"));
}

// The other components at full size: the Hub's file sizes (CLIP-L 247 MB, CLIP-G 1.39 GB, T5
// 9.52 GB in two shards, VAE 168 MB), sharded as save_pretrained does.
TEST(MakeRandomSd3Counts, FullSizeComponents) {
  const std::vector<rw::RandomComponent> c = rw::like_components(options_for("sd3.5-medium"));
  ASSERT_EQ(c.size(), 5u);
  const std::vector<std::string> folders{"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"};
  const std::vector<int64_t> params{123'650'304, 694'659'840, 4'762'310'656, 2'469'663'936, 83'819'683};
  const std::vector<size_t> files{2, 2, 4, 2, 2};  // config.json + weights (+ index)
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].folder, folders[i]);
    EXPECT_EQ(c[i].parameters(), params[i]) << folders[i];
    EXPECT_EQ(rw::plan_random_component(c[i], DType::bf16).files.size(), files[i]) << folders[i];
  }
  EXPECT_EQ(declared_shapes(c[0]).at("text_projection.weight"), (Shape{768, 768}));
  EXPECT_EQ(declared_shapes(c[1]).at("text_projection.weight"), (Shape{1280, 1280}));
  EXPECT_EQ(declared_shapes(c[1]).at("text_model.encoder.layers.31.mlp.fc1.weight"), (Shape{5120, 1280}));
  EXPECT_EQ(declared_shapes(c[1]).count("text_projection.bias"), 0u);
  // sd3-medium's are the same but for its transformer (2'084'951'104 parameters, 192 x 192 positions).
  const std::vector<rw::RandomComponent> c30 = rw::like_components(options_for("sd3-medium"));
  ASSERT_EQ(c30.size(), 5u);
  for (size_t i = 0; i < c30.size(); ++i) {
    EXPECT_EQ(c30[i].folder, folders[i]);
    EXPECT_EQ(c30[i].parameters(), i == 3 ? 2'084'951'104 : params[i]) << folders[i];
  }
  // FLUX.1's CLIP stays a CLIPTextModel without projection.
  EXPECT_EQ(declared_shapes(rw::like_component(options_for("flux1-schnell"), "text_encoder"))
                .count("text_projection.weight"),
            0u);
}

// §5.3 step 2 computed here in f64 for cell (row r, column c), channel ch.
double sincos_reference(int64_t M, int64_t r, int64_t c, int64_t ch) {
  const int64_t half = D / 2, quarter = D / 4, j = ch % half, k = j % quarter;
  const double g = (ch < half ? c : r) / (double(M) / 64.0);
  const double a = g * std::pow(10000.0, -double(k) / quarter);
  return j < quarter ? std::sin(a) : std::cos(a);
}

// The positional table is Diffusers' formula, the same for every seed.
TEST(MakeRandomSd3Counts, PositionalTableIsTheSincosFormula) {
  for (const bool v35 : {true, false}) {
    const int64_t M = v35 ? 384 : 192;
    const rw::RandomComponent tr = transformer(v35 ? "sd3.5-medium" : "sd3-medium", 1);
    const auto table = [&](uint64_t seed) {
      for (const io::StreamedTensor& t : rw::streamed_tensors(tr, DType::f32, seed))
        if (t.name == "pos_embed.pos_embed") return t;
      ADD_FAILURE() << "no pos_embed.pos_embed";
      return io::StreamedTensor{};
    };
    const io::StreamedTensor t0 = table(0), t7 = table(7);
    // A few whole cells: corners, the centre, and the first cell of a 1024² image's crop.
    const int64_t top = (M - 64) / 2;
    for (const auto& [r, c] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 0}, {0, M - 1}, {M - 1, 0}, {M - 1, M - 1}, {M / 2, M / 3}, {top, top}, {top + 63, top + 5}}) {
      std::vector<float> a(D), b(D);
      t0.fill((r * M + c) * D, D, a.data());
      t7.fill((r * M + c) * D, D, b.data());
      EXPECT_EQ(a, b);
      for (int64_t ch = 0; ch < D; ++ch)
        ASSERT_NEAR(a[size_t(ch)], sincos_reference(M, r, c, ch), 2e-6) << "M " << M << " cell " << r << "," << c
                                                                          << " channel " << ch;
    }
    // Cell (0, 0): sin(0) = 0 and cos(0) = 1 in each half.
    std::vector<float> v(D);
    t0.fill(0, D, v.data());
    EXPECT_EQ(v[0], 0.f);
    EXPECT_EQ(v[D / 4], 1.f);
    EXPECT_EQ(v[D / 2], 0.f);
    EXPECT_EQ(v[3 * D / 4], 1.f);
  }
}

// ---- the CLI, end to end ----

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
  return !ec && fs::is_directory("/dev/shm") && shm.available > (uint64_t(8) << 30) ? fs::path("/dev/shm")
                                                                                     : fs::temp_directory_path();
}

class MakeRandomSd3Cli : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_root() / ("kiln_make_random_sd3_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// SD3's configs (§2), typed here independently of the tool, with the depths replaced.
void expect_sd3_configs(const fs::path& dir) {
  const nlohmann::json index = read_json(dir / "model_index.json");
  EXPECT_EQ(index["_class_name"], "StableDiffusion3Pipeline");
  for (const auto& [component, library, cls] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"scheduler", "diffusers", "FlowMatchEulerDiscreteScheduler"},
           {"text_encoder", "transformers", "CLIPTextModelWithProjection"},
           {"text_encoder_2", "transformers", "CLIPTextModelWithProjection"},
           {"text_encoder_3", "transformers", "T5EncoderModel"},
           {"tokenizer", "transformers", "CLIPTokenizer"},
           {"tokenizer_2", "transformers", "CLIPTokenizer"},
           {"tokenizer_3", "transformers", "T5Tokenizer"},  // the copied folder is a slow tokenizer's
           {"transformer", "diffusers", "SD3Transformer2DModel"},
           {"vae", "diffusers", "AutoencoderKL"}})
    EXPECT_EQ(index[component], nlohmann::json::array({library, cls})) << component;
  EXPECT_EQ(index.size(), 11u) << index.dump();  // the above, _class_name and _diffusers_version

  const nlohmann::json scheduler = read_json(dir / "scheduler" / "scheduler_config.json");
  EXPECT_EQ(scheduler["_class_name"], "FlowMatchEulerDiscreteScheduler");
  EXPECT_EQ(scheduler["shift"], 3.0);
  EXPECT_EQ(scheduler["num_train_timesteps"], 1000);
  EXPECT_FALSE(scheduler.value("use_dynamic_shifting", false));

  nlohmann::json transformer = read_json(dir / "transformer" / "config.json");
  transformer.erase("_diffusers_version");
  EXPECT_EQ(transformer, nlohmann::json::parse(R"({
    "_class_name": "SD3Transformer2DModel", "attention_head_dim": 64, "caption_projection_dim": 1536,
    "dual_attention_layers": [0, 1], "in_channels": 16, "joint_attention_dim": 4096, "num_attention_heads": 24,
    "num_layers": 2, "out_channels": 16, "patch_size": 2, "pooled_projection_dim": 2048, "pos_embed_max_size": 384,
    "qk_norm": "rms_norm", "sample_size": 128})"));

  const nlohmann::json vae = read_json(dir / "vae" / "config.json");
  EXPECT_EQ(vae["_class_name"], "AutoencoderKL");
  EXPECT_EQ(vae["latent_channels"], 16);
  EXPECT_EQ(vae["scaling_factor"], 1.5305);
  EXPECT_EQ(vae["shift_factor"], 0.0609);
  EXPECT_EQ(vae["use_quant_conv"], false);
  EXPECT_EQ(vae["use_post_quant_conv"], false);
  EXPECT_EQ(vae["block_out_channels"], nlohmann::json::parse("[128, 256, 512, 512]"));
  EXPECT_EQ(vae["layers_per_block"], 2);
  EXPECT_EQ(vae["norm_num_groups"], 32);
  EXPECT_EQ(vae["act_fn"], "silu");
  EXPECT_EQ(vae["sample_size"], 1024);

  const auto expect_clip = [&](const char* folder, int64_t hidden, int64_t layers, int64_t heads, int64_t inter,
                               const char* act) {
    SCOPED_TRACE(folder);
    const nlohmann::json c = read_json(dir / folder / "config.json");
    EXPECT_EQ(c["architectures"], nlohmann::json::array({"CLIPTextModelWithProjection"}));
    EXPECT_EQ(c["hidden_size"], hidden);
    EXPECT_EQ(c["num_hidden_layers"], layers);
    EXPECT_EQ(c["num_attention_heads"], heads);
    EXPECT_EQ(c["intermediate_size"], inter);
    EXPECT_EQ(c["hidden_act"], act);
    EXPECT_EQ(c["projection_dim"], hidden);
    EXPECT_EQ(c["max_position_embeddings"], 77);
    EXPECT_EQ(c["vocab_size"], 49408);
    EXPECT_EQ(c["layer_norm_eps"], 1e-5);
    EXPECT_EQ(c["torch_dtype"], "bfloat16");
  };
  expect_clip("text_encoder", 768, 12, 12, 3072, "quick_gelu");
  expect_clip("text_encoder_2", 1280, 32, 20, 5120, "gelu");
  const nlohmann::json t5 = read_json(dir / "text_encoder_3" / "config.json");
  EXPECT_EQ(t5["architectures"], nlohmann::json::array({"T5EncoderModel"}));
  EXPECT_EQ(t5["num_layers"], 1);
  EXPECT_EQ(t5["d_model"], 4096);
  EXPECT_EQ(t5["d_ff"], 10240);
  EXPECT_EQ(t5["num_heads"], 64);
  EXPECT_EQ(t5["feed_forward_proj"], "gated-gelu");
}

// The tokenizers: CLIP's copied (tokenizer_2 padding with "!", the only difference), T5's copied.
void expect_tokenizers(const fs::path& dir) {
  const fs::path bundled = fs::path(KILN_FIXTURES_DIR) / "flux1_tiny_arch" / "pipeline";
  for (const auto& [to, from] : std::vector<std::pair<std::string, std::string>>{
           {"tokenizer", "tokenizer"}, {"tokenizer_2", "tokenizer"}, {"tokenizer_3", "tokenizer_2"}}) {
    EXPECT_EQ(entries(dir / to), entries(bundled / from)) << to;
    for (const auto& e : fs::directory_iterator(bundled / from)) {
      const std::string name = e.path().filename().string();
      if (to == "tokenizer_2" && (name == "special_tokens_map.json" || name == "tokenizer_config.json")) continue;
      EXPECT_EQ(file_bytes(dir / to / name), file_bytes(e.path())) << to << "/" << name;
    }
  }
  EXPECT_EQ(read_json(dir / "tokenizer_2" / "special_tokens_map.json")["pad_token"], "!");
  const nlohmann::json config = read_json(dir / "tokenizer_2" / "tokenizer_config.json");
  EXPECT_EQ(config["pad_token"], "!");
  const int64_t bang = read_json(bundled / "tokenizer" / "vocab.json")["!"].get<int64_t>();
  EXPECT_EQ(config["added_tokens_decoder"][std::to_string(bang)]["content"], "!");

  // kiln's tokenizer honours it: tokenizer pads with <|endoftext|>, tokenizer_2 with "!".
  const auto clip = tokenizers::ClipTokenizer::from_pretrained(dir / "tokenizer"),
             clip2 = tokenizers::ClipTokenizer::from_pretrained(dir / "tokenizer_2");
  EXPECT_EQ(clip2.pad_id(), bang);
  EXPECT_NE(clip.pad_id(), bang);
  const std::vector<int64_t> a = clip.encode_padded("a photo", 77), b = clip2.encode_padded("a photo", 77);
  ASSERT_EQ(a.size(), 77u);
  ASSERT_EQ(b.size(), 77u);
  EXPECT_EQ(a.back(), clip.pad_id());
  EXPECT_EQ(b.back(), bang);
  EXPECT_EQ(std::vector<int64_t>(a.begin(), a.begin() + 4), std::vector<int64_t>(b.begin(), b.begin() + 4));
  EXPECT_EQ(tokenizers::T5Tokenizer::from_pretrained(dir / "tokenizer_3").pad_id(), 0);
}

// Every transformer tensor of §5.1 for the blocks written (0: dual attention, 1: dual and last),
// in bf16; every component read by kiln's loaders with nothing left over.
void expect_weights(const fs::path& dir) {
  {
    const io::SafetensorsIndex index(dir / "transformer");
    Shapes written;
    for (const std::string& name : index.names()) {
      const io::TensorInfo info = index.info(name);
      EXPECT_EQ(info.dtype_string, "BF16") << name;
      written[name] = info.shape;
    }
    EXPECT_EQ(written, sd3_transformer_shapes(true, 2));
  }
  for (const auto& [folder, width] : {std::pair{"text_encoder", 768}, std::pair{"text_encoder_2", 1280}}) {
    const io::SafetensorsIndex index(dir / folder);
    ASSERT_TRUE(index.contains("text_projection.weight")) << folder;
    EXPECT_EQ(index.info("text_projection.weight").shape, (Shape{width, width})) << folder;
    EXPECT_EQ(index.info("text_projection.weight").dtype_string, "BF16") << folder;
  }
  const auto unused = [](const auto& load) {
    nn::CheckpointAudit audit;
    load();
    return audit.unused({});
  };
  const std::vector<std::string> none;
  for (const char* clip : {"text_encoder", "text_encoder_2"})
    EXPECT_EQ(unused([&] { ClipTextModel::from_pretrained(dir / clip, ClipPooledRule::eos2_argmax, DType::bf16); }),
              none)
        << clip;
  EXPECT_EQ(unused([&] { T5EncoderModel::from_pretrained(dir / "text_encoder_3", DType::bf16); }), none);
  EXPECT_EQ(unused([&] { SD3Transformer2DModel::from_pretrained(dir / "transformer", DType::bf16); }), none);
  EXPECT_EQ(unused([&] { AutoencoderKL::from_pretrained(dir / "vae", DType::bf16); }), none);
  const AutoencoderKL vae = AutoencoderKL::from_pretrained(dir / "vae", DType::bf16);
  EXPECT_EQ(vae.config().scaling_factor, 1.5305);
  EXPECT_EQ(vae.config().shift_factor, 0.0609);
}

// Finite values of unit scale in bf16 (root mean square in [1/4, 4]; 1.18, 1.02, 1.02 and 1.00
// here): the transformer's velocity at a tiny latent, the CLIP towers' projected pooled outputs
// (text_embeds), T5's output.
void expect_finite_outputs(const fs::path& dir) {
  const auto expect_unit = [](const Tensor& t, const Shape& shape, const char* what) {
    EXPECT_EQ(t.shape(), shape) << what;
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
    const SD3Transformer2DModel tr = SD3Transformer2DModel::from_pretrained(dir / "transformer", DType::bf16);
    EXPECT_EQ(tr.config().num_layers, 2);
    EXPECT_EQ(tr.config().inner_dim(), D);
    EXPECT_TRUE(tr.config().block_structure(1).dual_attention);
    EXPECT_TRUE(tr.config().block_structure(1).context_pre_only);
    const Tensor velocity = tr.forward(input({1, 16, 8, 8}, 1), input({1, 12, 4096}, 2), input({1, 2048}, 3),
                                       from_vector({500.f}, {1}));
    expect_unit(velocity, {1, 16, 8, 8}, "transformer velocity");
  }
  const Tensor ids = from_ints({998, 5, 17, 300, 999, 33, 33, 33}, {1, 8});
  for (const auto& [folder, width] :
       {std::pair{"text_encoder", int64_t(768)}, std::pair{"text_encoder_2", int64_t(1280)}}) {
    const ClipTextModel clip = ClipTextModel::from_pretrained(dir / folder, ClipPooledRule::eos2_argmax, DType::bf16);
    EXPECT_TRUE(clip.config().with_projection) << folder;
    expect_unit(clip.forward(ids).text_embeds, {1, width}, folder);
  }
  const T5EncoderModel t5 = T5EncoderModel::from_pretrained(dir / "text_encoder_3", DType::bf16);
  expect_unit(t5.forward(from_ints({37, 5, 500, 1, 0, 0}, {1, 6})).last_hidden_state, {1, 6, 4096}, "T5 output");
}

// One run of the CLI (sd3.5-medium at the real widths, 2 transformer blocks, 1 T5 layer, 3.1 GB
// in bf16), checked every way in one test so that it is written once.
TEST_F(MakeRandomSd3Cli, WritesAnSd35MediumFolderKilnLoadsAndRuns) {
  const fs::path dir = dir_ / "sd35m-2";
  const CliRun run = make_random(dir.string() + " --like sd3.5-medium --blocks 2 --t5-layers 1 --seed 3");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(entries(dir_), std::vector<std::string>{"sd35m-2"});  // no temporary left beside it
  EXPECT_EQ(entries(dir), (std::vector<std::string>{"model_index.json", "scheduler", "text_encoder", "text_encoder_2",
                                                    "text_encoder_3", "tokenizer", "tokenizer_2", "tokenizer_3",
                                                    "transformer", "vae"}));
  EXPECT_NE(run.output.find("sd3.5-medium folder (2 transformer blocks (2 with dual attention), 1 T5 layers, bf16, "
                            "seed 3)"),
            std::string::npos)
      << run.output;
  for (const char* line : {"text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae"})
    EXPECT_NE(run.output.find(std::string("  ") + line + " "), std::string::npos) << line << "\n" << run.output;
  {
    SCOPED_TRACE("SD3's configs");
    expect_sd3_configs(dir);
  }
  {
    SCOPED_TRACE("tokenizers");
    expect_tokenizers(dir);
  }
  {
    SCOPED_TRACE("weights: keys, shapes, dtype; kiln's loaders read everything");
    expect_weights(dir);
  }
  {
    SCOPED_TRACE("finite outputs in bf16");
    expect_finite_outputs(dir);
  }
}

// sd3-medium's transformer config (make-random's, the Hub's file; 3.0 Medium has no dual attention
// or QK norm and a 192 x 192 table) is what kiln reads.
TEST(MakeRandomSd3Counts, Sd3MediumConfig) {
  const nlohmann::json c = transformer("sd3-medium").config;
  EXPECT_FALSE(c.contains("dual_attention_layers"));
  EXPECT_FALSE(c.contains("qk_norm"));
  EXPECT_EQ(c["pos_embed_max_size"], 192);
  const SD3TransformerConfig parsed =
      SD3TransformerConfig::from_json(io::JsonConfig::from_string(c.dump(), "sd3-medium"));
  EXPECT_EQ(parsed.num_layers, 24);
  EXPECT_EQ(parsed.inner_dim(), D);
  EXPECT_EQ(parsed.caption_projection_dim, D);
  EXPECT_FALSE(parsed.qk_norm.has_value());
  EXPECT_TRUE(parsed.dual_attention_layers.empty());
  const SD3TransformerConfig p35 = SD3TransformerConfig::from_json(
      io::JsonConfig::from_string(transformer("sd3.5-medium").config.dump(), "sd3.5-medium"));
  EXPECT_EQ(p35.dual_attention_layers, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(p35.qk_norm, std::optional<std::string>("rms_norm"));
  EXPECT_EQ(p35.pos_embed_max_size, 384);
  EXPECT_EQ(p35.num_layers, 24);
  const rw::LikeRecipe& r = rw::like_recipe("sd3-medium");
  EXPECT_EQ(r.hub_json("model_index.json")["_class_name"], "StableDiffusion3Pipeline");
  EXPECT_EQ(r.hub_json("scheduler/scheduler_config.json")["shift"], 3.0);
}

// Bad input fails before any work, naming the flag, and leaves nothing behind; the help names
// the new --like values.
TEST_F(MakeRandomSd3Cli, BadInputFailsBeforeWriting) {
  const std::string out = (dir_ / "out").string();
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {out + " --like sd3-large", "--like sd3-large: expected flux1-schnell or flux1-dev"},
           {out + " --like sd3-large", "sd3-medium or sd3.5-medium"},
           {out + " --like sd3.5-medium --blocks 19+38", "--blocks 19+38: expected N, the number of transformer "
                                                         "blocks of sd3.5-medium"},
           {out + " --like sd3-medium --blocks 0", "--blocks 0: sd3-medium needs at least 1 transformer block"},
           {out + " --like sd3-medium --blocks x", "--blocks x: expected N"},
           {out + " --like sd3.5-medium --t5-layers 0", "--t5-layers 0: sd3.5-medium needs at least 1 T5 layer"},
           {out + " --like sd3.5-medium --dtype f64", "--dtype f64: expected bf16, f16 or f32"},
           {out + " --like flux1-dev --blocks 24", "--blocks 24: expected D+S"},
       }) {
    const CliRun r = make_random(args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
    EXPECT_EQ(r.output.find("writing"), std::string::npos) << r.output;
  }
  // --blocks before --like is read as --like says.
  const CliRun r = make_random(out + " --blocks 1+1 --like sd3-medium");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--blocks 1+1: expected N"), std::string::npos) << r.output;
  EXPECT_EQ(entries(dir_), std::vector<std::string>{});
  // The library refuses the same depths.
  test::expect_error([] { rw::like_components({"sd3-medium", {{"--blocks", {0}}}}); },
                     {"--blocks 0: sd3-medium needs at least 1 transformer block"});
  test::expect_error([] { rw::like_components({"sd3.5-medium", {{"--t5-layers", {0}}}}); },
                     {"--t5-layers 0: sd3.5-medium needs at least 1 T5 layer"});
  test::expect_error([] { rw::like_components({"sd3-medium", {{"--blocks", {1, 1}}}}); },
                     {"--blocks 1+1: sd3-medium takes N"});

  const CliRun help = make_random("--help");
  EXPECT_EQ(help.exit_code, 0) << help.output;
  for (const char* s : {"flux1-schnell|flux1-dev|sd3-medium|sd3.5-medium", "Stable Diffusion 3", "--t5-layers"})
    EXPECT_NE(help.output.find(s), std::string::npos) << s << "\n" << help.output;
}

}  // namespace
}  // namespace kiln
