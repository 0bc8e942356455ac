// Single-file checkpoints in their original key layouts (nn/key_mapped_source.h, io/key_map.h):
// each family's tiny Diffusers fixture written in the original layout by the inverse map, read
// back through KeyMappedSource (every tensor byte for byte, the exact original key set), the
// model built from the mapped file against the model built from the Diffusers folder (outputs
// bit for bit), and the errors for unmatched, missing and misplaced tensors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/buffer.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "golden.h"
#include "io/json_config.h"
#include "io/safetensors.h"
#include "models/flux/flux_transformer.h"
#include "models/flux2/flux2_transformer.h"
#include "models/sd3/sd3_transformer.h"
#include "models/transformer_families.h"
#include "models/vae/autoencoder_kl.h"
#include "nn/key_mapped_source.h"
#include "pipelines/component_file.h"
#include "nn/weights.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

// A folder of its own for each test, removed with it.
class Scratch {
 public:
  Scratch() : dir_(fs::temp_directory_path() / ("kiln_original_keys_" + std::to_string(::getpid()) + "_" +
                                                ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Scratch() { fs::remove_all(dir_); }
  fs::path operator/(const std::string& name) const { return dir_ / name; }

 private:
  fs::path dir_;
};

fs::path component_dir(const std::string& set, const std::string& component) {
  return test::pipeline_dir(set) / component;
}

std::vector<std::string> file_keys(const fs::path& file) { return io::SafetensorsFile(file).names(); }

// "x" -> "x.weight", "x.bias"
std::vector<std::string> wb(const std::string& layer) { return {layer + ".weight", layer + ".bias"}; }
std::vector<std::string> sorted_keys(std::initializer_list<std::vector<std::string>> groups) {
  std::vector<std::string> out;
  for (const auto& g : groups) out.insert(out.end(), g.begin(), g.end());
  std::sort(out.begin(), out.end());
  return out;
}

// The bytes of `key` as `source` stores it.
std::vector<char> stored_bytes(const nn::WeightSource& source, const std::string& key) {
  const Tensor t = source.load(key, source.stored_dtype(key).value_or(DType::f32));
  wait(t);
  EXPECT_TRUE(t.is_contiguous()) << key;
  const char* p = static_cast<const char*>(t.data_ptr());
  return std::vector<char>(p, p + t.nbytes());
}

// Every tensor of `want` is in `got` under the same name, with the same shape, dtype and bytes.
void expect_same_tensors(const nn::WeightSource& want, const nn::WeightSource& got) {
  ASSERT_EQ(got.names(), want.names());
  for (const std::string& k : want.names()) {
    EXPECT_EQ(got.shape(k), want.shape(k)) << k;
    EXPECT_EQ(got.stored_dtype(k).value_or(DType::i64), want.stored_dtype(k).value_or(DType::i64)) << k;
    EXPECT_TRUE(stored_bytes(got, k) == stored_bytes(want, k)) << k << " differs";
  }
}

// The rows [begin, end) of a stored 2-D or 1-D f32 tensor's bytes.
std::vector<char> row_bytes(const nn::WeightSource& source, const std::string& key, int64_t begin, int64_t end) {
  const Shape s = source.shape(key);
  const int64_t row = (s.size() == 1 ? 1 : s[1]) * 4;
  const std::vector<char> all = stored_bytes(source, key);
  return std::vector<char>(all.begin() + begin * row, all.begin() + end * row);
}

// Writes a Diffusers component folder in the original layout and opens the file for `component`.
struct RoundTrip {
  std::shared_ptr<const nn::WeightSource> diffusers, original, mapped;
  fs::path file;
};
RoundTrip round_trip(const Scratch& scratch, const fs::path& folder, const io::KeyMap& map, const std::string& component,
                     const std::string& prefix = "") {
  RoundTrip r;
  r.diffusers = nn::open_checkpoint(folder);
  r.file = scratch / (component + ".safetensors");
  nn::write_original_layout(*r.diffusers, map, r.file, prefix);
  r.original = nn::open_checkpoint(r.file);
  r.mapped = open_component_file(r.file, component);
  return r;
}

// A copy of `from` without the tensors `drop`, with `extra` added.
void rewrite(const fs::path& from, const fs::path& to, const std::set<std::string>& drop,
             const std::vector<std::pair<std::string, Tensor>>& extra = {}) {
  const io::SafetensorsFile f(from);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& k : f.names())
    if (!drop.count(k)) tensors.emplace_back(k, f.load(k));
  tensors.insert(tensors.end(), extra.begin(), extra.end());
  for (const auto& [k, t] : tensors) wait(t);
  io::save_safetensors(to, tensors);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = to_vector(a), y = to_vector(b);
  EXPECT_EQ(x.size(), y.size());
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::fabs(double(x[i]) - y[i]));
  return worst;
}

// ---------------------------------------------------------------- FLUX.1

TEST(OriginalKeysFlux1, RoundTripKeepsEveryTensorUnderTheBflNames) {
  const Scratch scratch;
  const RoundTrip r = round_trip(scratch, component_dir("flux1_tiny", "transformer"),
                                 original_key_map(io::Layout::flux1_bfl), "transformer");
  // flux1_tiny: D = 32, one double and one single block, no guidance embedder.
  const std::string d = "double_blocks.0.", s = "single_blocks.0.";
  EXPECT_EQ(file_keys(r.file),
            sorted_keys({wb("img_in"), wb("txt_in"), wb("time_in.in_layer"), wb("time_in.out_layer"),
                         wb("vector_in.in_layer"), wb("vector_in.out_layer"), wb("final_layer.linear"),
                         wb("final_layer.adaLN_modulation.1"), wb(d + "img_mod.lin"), wb(d + "txt_mod.lin"),
                         wb(d + "img_attn.qkv"), wb(d + "txt_attn.qkv"),
                         {d + "img_attn.norm.query_norm.scale", d + "img_attn.norm.key_norm.scale",
                          d + "txt_attn.norm.query_norm.scale", d + "txt_attn.norm.key_norm.scale"},
                         wb(d + "img_attn.proj"), wb(d + "txt_attn.proj"), wb(d + "img_mlp.0"), wb(d + "img_mlp.2"),
                         wb(d + "txt_mlp.0"), wb(d + "txt_mlp.2"), wb(s + "modulation.lin"), wb(s + "linear1"),
                         {s + "norm.query_norm.scale", s + "norm.key_norm.scale"}, wb(s + "linear2")}));
  EXPECT_EQ(r.original->shape("double_blocks.0.img_attn.qkv.weight"), (Shape{3 * 32, 32}));
  EXPECT_EQ(r.original->shape("double_blocks.0.txt_attn.qkv.bias"), (Shape{3 * 32}));
  EXPECT_EQ(r.original->shape("single_blocks.0.linear1.weight"), (Shape{3 * 32 + 4 * 32, 32}));
  EXPECT_EQ(r.original->shape("single_blocks.0.linear1.bias"), (Shape{7 * 32}));
  EXPECT_EQ(r.original->shape("final_layer.adaLN_modulation.1.weight"), (Shape{64, 32}));

  // q, k, v in that row order; the MLP after them; BFL's (shift, scale) is Diffusers' (scale, shift).
  const auto& o = *r.original;
  const auto& df = *r.diffusers;
  EXPECT_EQ(row_bytes(o, d + "img_attn.qkv.weight", 32, 64), stored_bytes(df, "transformer_blocks.0.attn.to_k.weight"));
  EXPECT_EQ(row_bytes(o, s + "linear1.bias", 96, 224), stored_bytes(df, "single_transformer_blocks.0.proj_mlp.bias"));
  EXPECT_EQ(row_bytes(o, "final_layer.adaLN_modulation.1.weight", 0, 32), row_bytes(df, "norm_out.linear.weight", 32, 64));
  EXPECT_EQ(row_bytes(o, "final_layer.adaLN_modulation.1.bias", 32, 64), row_bytes(df, "norm_out.linear.bias", 0, 32));

  EXPECT_EQ(detect_original_layout(*r.original, "transformer").layout, io::Layout::flux1_bfl);
  ASSERT_NE(dynamic_cast<const nn::KeyMappedSource*>(r.mapped.get()), nullptr);
  expect_same_tensors(*r.diffusers, *r.mapped);
}

TEST(OriginalKeysFlux1, SplitPartsAreViewsOfOneLoadAndCountAsReadTogether) {
  const Scratch scratch;
  const RoundTrip r = round_trip(scratch, component_dir("flux1_tiny", "transformer"),
                                 original_key_map(io::Layout::flux1_bfl), "transformer");
  const auto& m = *r.mapped;
  const std::string qkv = "double_blocks.0.img_attn.qkv.weight";
  const auto unread = [&] {
    const auto u = m.unread();
    return std::set<std::string>(u.begin(), u.end());
  };
  EXPECT_EQ(unread().size(), 48u);
  const Tensor q = m.load("transformer_blocks.0.attn.to_q.weight", DType::f32);
  const Tensor k = m.load("transformer_blocks.0.attn.to_k.weight", DType::f32);
  EXPECT_EQ(q.buffer(), k.buffer()) << "the parts share the original's one buffer";
  EXPECT_TRUE(q.buffer()->maps_file()) << "read in place from the mapped file";
  EXPECT_EQ(static_cast<const char*>(k.data_ptr()) - static_cast<const char*>(q.data_ptr()), 32 * 32 * 4);
  EXPECT_TRUE(unread().count(qkv)) << "v is not read yet";
  m.load("transformer_blocks.0.attn.to_v.weight", DType::f32);
  EXPECT_FALSE(unread().count(qkv));
  // A converted load is converted once for all parts, too.
  const Tensor qb = m.load("transformer_blocks.0.attn.to_q.weight", DType::bf16);
  const Tensor vb = m.load("transformer_blocks.0.attn.to_v.weight", DType::bf16);
  EXPECT_EQ(qb.buffer(), vb.buffer());
  EXPECT_EQ(static_cast<const char*>(vb.data_ptr()) - static_cast<const char*>(qb.data_ptr()), 2 * 32 * 32 * 2);

  // Slices (tensor parallelism) of a split part: rows read only their rows, columns of every row.
  const std::string key = "single_transformer_blocks.0.proj_mlp.weight";  // rows 96..224 of linear1
  const std::vector<float> whole = to_vector(m.load(key, DType::f32));
  const std::vector<float> rows = to_vector(m.load_slice(key, 0, 10, 20, DType::f32));
  EXPECT_EQ(rows, std::vector<float>(whole.begin() + 10 * 32, whole.begin() + 30 * 32));
  const Tensor cols = m.load_slice(key, 1, 8, 16, DType::f32);
  ASSERT_EQ(cols.shape(), (Shape{128, 16}));
  const std::vector<float> c = to_vector(cols);
  for (int64_t i = 0; i < 128; ++i)
    for (int64_t j = 0; j < 16; ++j) ASSERT_EQ(c[size_t(i * 16 + j)], whole[size_t(i * 32 + 8 + j)]) << i << "," << j;
  const std::vector<float> bias = to_vector(m.load("single_transformer_blocks.0.attn.to_v.bias", DType::f32));
  EXPECT_EQ(to_vector(m.load_slice("single_transformer_blocks.0.attn.to_v.bias", 0, 4, 8, DType::f32)),
            std::vector<float>(bias.begin() + 4, bias.begin() + 12));
  // A swapped tensor sliced: the rows of the swapped whole.
  const std::vector<float> norm_out = to_vector(m.load("norm_out.linear.bias", DType::f32));
  EXPECT_EQ(to_vector(m.load_slice("norm_out.linear.bias", 0, 30, 4, DType::f32)),
            std::vector<float>(norm_out.begin() + 30, norm_out.begin() + 34));
}

// The transformer built from the BFL file computes what the one built from the Diffusers folder
// computes, bit for bit, and reads every tensor of the file.
TEST(OriginalKeysFlux1, ModelFromTheBflFileMatchesTheDiffusersFolder) {
  const Scratch scratch;
  const std::string set = "flux1_tiny_arch";
  const fs::path dir = component_dir(set, "transformer");
  const RoundTrip r =
      round_trip(scratch, dir, original_key_map(io::Layout::flux1_bfl), "transformer", "model.diffusion_model.");
  const auto config = FluxTransformerConfig::from_json(io::JsonConfig(dir / "config.json"));
  std::optional<FluxTransformer2DModel> mapped;
  {
    nn::CheckpointAudit audit;
    mapped.emplace(config, nn::Weights(open_component_file(r.file, "transformer")));
    EXPECT_EQ(audit.unused({}), std::vector<std::string>{});
  }
  const auto folder = FluxTransformer2DModel::from_pretrained(dir);
  const auto g = [&](const std::string& k) { return test::golden(set, k); };
  const auto run = [&](const FluxTransformer2DModel& m) {
    return m.forward(g("transformer.step0.in.hidden_states"), g("transformer.in.encoder_hidden_states"),
                     g("transformer.in.pooled_projections"), g("transformer.step0.in.timestep"),
                     g("transformer.in.img_ids"), g("transformer.in.txt_ids"));
  };
  const Tensor want = run(folder), got = run(*mapped);
  EXPECT_EQ(max_abs_diff(got, want), 0.0);
  EXPECT_LE(max_abs_diff(got, g("transformer.step0.out")), 1e-4) << "and Diffusers' own output";
}

// ---------------------------------------------------------------- errors (on FLUX.1)

TEST(OriginalKeysErrors, AMapLeavingATensorUnmatchedNamesTheFileAndTheTensor) {
  const Scratch scratch;
  const RoundTrip r = round_trip(scratch, component_dir("flux1_tiny", "transformer"),
                                 original_key_map(io::Layout::flux1_bfl), "transformer");
  io::KeyMap partial = original_key_map(io::Layout::flux1_bfl);
  std::erase_if(partial.rules, [](const io::KeyRule& rule) { return rule.original == "img_in.weight"; });
  test::expect_error([&] { (void)nn::KeyMappedSource(r.original, partial); },
                     {r.file.string(), "'img_in.weight'", "no rule matches it"});
  // A file with a tensor the layout does not have.
  const fs::path extra = scratch / "extra.safetensors";
  rewrite(r.file, extra, {}, {{"double_blocks.0.img_attn.lora_up.weight", zeros({4, 32})}});
  test::expect_error([&] { open_component_file(extra, "transformer"); },
                     {extra.string(), "'double_blocks.0.img_attn.lora_up.weight'", "FLUX.1"});
}

TEST(OriginalKeysErrors, AMissingFusedTensorIsNamedWithWhatItHolds) {
  const Scratch scratch;
  const RoundTrip r = round_trip(scratch, component_dir("flux1_tiny", "transformer"),
                                 original_key_map(io::Layout::flux1_bfl), "transformer");
  const fs::path lacking = scratch / "lacking.safetensors";
  rewrite(r.file, lacking, {"double_blocks.0.img_attn.qkv.weight"});
  test::expect_error([&] { open_component_file(lacking, "transformer"); },
                     {lacking.string(), "'double_blocks.0.img_attn.qkv.weight' is missing",
                      "'transformer_blocks.0.attn.to_q.weight'", "'transformer_blocks.0.attn.to_v.weight'"});
  // A required top-level tensor, too.
  rewrite(r.file, lacking, {"final_layer.adaLN_modulation.1.bias"});
  test::expect_error([&] { open_component_file(lacking, "transformer"); },
                     {"'final_layer.adaLN_modulation.1.bias' is missing", "'norm_out.linear.bias'"});
  // A Diffusers tensor the model asks for and no rule gives (a config with more blocks).
  const auto m = open_component_file(r.file, "transformer");
  EXPECT_FALSE(m->contains("transformer_blocks.1.attn.to_q.weight"));
  test::expect_error([&] { m->load("transformer_blocks.1.attn.to_q.weight", DType::f32); },
                     {r.file.string(), "'transformer_blocks.1.attn.to_q.weight'"});
  test::expect_error([&] { nn::Weights(m).get("transformer_blocks.1.attn.to_q.weight", {32, 32}); },
                     {r.file.string(), "'transformer_blocks.1.attn.to_q.weight' is missing"});
}

TEST(OriginalKeysErrors, TheInverseNamesWhatItCannotPlace) {
  const Scratch scratch;
  const fs::path dir = component_dir("flux1_tiny", "transformer");
  const fs::path diffusers = scratch / "diffusers.safetensors";
  rewrite(dir / "diffusion_pytorch_model.safetensors", diffusers, {"transformer_blocks.0.attn.to_k.weight"});
  test::expect_error(
      [&] {
        nn::write_original_layout(*nn::open_checkpoint(diffusers), original_key_map(io::Layout::flux1_bfl),
                                  scratch / "o.safetensors");
      },
      {"'double_blocks.0.img_attn.qkv.weight'", "'transformer_blocks.0.attn.to_k.weight' is missing"});
  rewrite(dir / "diffusion_pytorch_model.safetensors", diffusers, {}, {{"transformer_blocks.0.attn.to_gate.weight", zeros({2})}});
  test::expect_error(
      [&] {
        nn::write_original_layout(*nn::open_checkpoint(diffusers), original_key_map(io::Layout::flux1_bfl),
                                  scratch / "o.safetensors");
      },
      {"'transformer_blocks.0.attn.to_gate.weight' has no place in the FLUX.1"});
  EXPECT_FALSE(fs::exists(scratch / "o.safetensors"));
}

// ComfyUI's transformer files and full checkpoints prefix the transformer's keys with
// "model.diffusion_model." and the VAE's with "first_stage_model.": each component reads its own.
TEST(OriginalKeysPrefix, ComfyUiAndFullCheckpointPrefixesAreStripped) {
  const Scratch scratch;
  const RoundTrip t = round_trip(scratch, component_dir("flux1_tiny", "transformer"),
                                 original_key_map(io::Layout::flux1_bfl), "transformer", "model.diffusion_model.");
  for (const std::string& k : file_keys(t.file)) EXPECT_TRUE(k.starts_with("model.diffusion_model.")) << k;
  const io::DetectedLayout layout = detect_original_layout(*t.original, "transformer");
  EXPECT_EQ(layout.layout, io::Layout::flux1_bfl);
  EXPECT_EQ(layout.prefix, "model.diffusion_model.");
  expect_same_tensors(*t.diffusers, *t.mapped);

  // One file with both components.
  const auto vae_diffusers = nn::open_checkpoint(component_dir("flux1_tiny", "vae"));
  const fs::path vae_file = scratch / "vae.safetensors", full = scratch / "full.safetensors";
  nn::write_original_layout(*vae_diffusers, original_key_map(io::Layout::ldm_vae), vae_file, "first_stage_model.");
  std::vector<std::pair<std::string, Tensor>> vae_tensors;
  const io::SafetensorsFile vf(vae_file);
  for (const std::string& k : vf.names()) vae_tensors.emplace_back(k, vf.load(k));
  rewrite(t.file, full, {}, vae_tensors);
  const auto transformer = open_component_file(full, "transformer");
  const auto vae = open_component_file(full, "vae");
  EXPECT_EQ(detect_original_layout(*nn::open_checkpoint(full), "vae").prefix, "first_stage_model.");
  expect_same_tensors(*t.diffusers, *transformer);
  expect_same_tensors(*vae_diffusers, *vae);
  EXPECT_EQ(transformer->unread(), std::vector<std::string>{}) << "every tensor was read above";
  EXPECT_NE(transformer->describe().find("model.diffusion_model."), std::string::npos);
}

TEST(OriginalKeysDetect, LayoutsAndComponents) {
  const auto diffusers = nn::open_checkpoint(component_dir("flux1_tiny", "transformer"));
  EXPECT_EQ(detect_original_layout(*diffusers, "transformer").layout, io::Layout::diffusers);
  EXPECT_EQ(open_component_file(component_dir("flux1_tiny", "transformer") / "diffusion_pytorch_model.safetensors",
                                    "transformer")
                ->names(),
            diffusers->names())
      << "a Diffusers file is read as it is";
  EXPECT_EQ(detect_original_layout({"joint_blocks.0.x_block.attn.qkv.weight"}, "transformer").layout,
            io::Layout::sd3_stability);
  EXPECT_EQ(detect_original_layout({"single_stream_modulation.lin.weight", "double_blocks.0.img_attn.qkv.weight"}).layout,
            io::Layout::flux2_bfl);
  EXPECT_EQ(detect_original_layout({"vae.decoder.mid.block_1.norm1.weight"}, "vae").prefix, "vae.");
  EXPECT_EQ(detect_original_layout({"double_blocks.0.img_mod.lin.weight"}, "text_encoder").layout, io::Layout::diffusers);
  test::expect_error([] { detect_original_layout({"double_blocks.0.img_mod.lin.weight"}, "vae", "flux1-dev.safetensors"); },
                     {"flux1-dev.safetensors", "holds a transformer", "FLUX.1", "not a vae"});
}

// Whole rows of a block-quantized tensor are views too: the byte offsets come from storage_bytes.
TEST(OriginalKeysMachinery, BlockQuantizedRowsAreViewsAndSwapsMoveWholeRows) {
  const io::KeyMap map{"test",
                       {{.original = "blk.{i}.qkv",
                         .diffusers = {"blocks.{i}.q", "blocks.{i}.k", "blocks.{i}.v"},
                         .transform = io::KeyTransform::rows,
                         .row_units = {1, 1, 1}},
                        {.original = "mod", .diffusers = {"norm.linear"}, .transform = io::KeyTransform::swap_halves}}};
  auto source = std::make_shared<test::MapSource>(std::map<std::string, Tensor>{});
  const int64_t rows = 6, cols = 64;  // two q8_0 blocks a row
  const size_t row_bytes = storage_bytes(DType::q8_0, cols);
  const auto make = [&](int seed) {
    BufferPtr buf = host_allocate(rows * row_bytes);
    for (size_t b = 0; b < rows * row_bytes; ++b) static_cast<unsigned char*>(buf->data())[b] = uint8_t(b * 7 + seed);
    return Tensor::view_of(buf, {rows, cols}, DType::q8_0);
  };
  source->tensors["blk.0.qkv"] = make(1);
  source->tensors["mod"] = make(2);
  const nn::KeyMappedSource mapped(source, map);
  EXPECT_EQ(mapped.names(), (std::vector<std::string>{"blocks.0.k", "blocks.0.q", "blocks.0.v", "norm.linear"}));
  EXPECT_EQ(mapped.stored_dtype("blocks.0.k").value_or(DType::f32), DType::q8_0);
  const Tensor qkv = source->tensors["blk.0.qkv"], k = mapped.load("blocks.0.k", DType::q8_0);
  EXPECT_EQ(k.shape(), (Shape{2, cols}));
  EXPECT_EQ(k.buffer(), qkv.buffer());
  EXPECT_EQ(static_cast<const char*>(k.data_ptr()) - static_cast<const char*>(qkv.data_ptr()),
            ptrdiff_t(2 * row_bytes));
  EXPECT_EQ(k.nbytes(), 2 * row_bytes);
  const Tensor mod = source->tensors["mod"], swapped = mapped.load("norm.linear", DType::q8_0);
  const char* a = static_cast<const char*>(mod.data_ptr());
  const char* b = static_cast<const char*>(swapped.data_ptr());
  EXPECT_EQ(std::memcmp(b, a + 3 * row_bytes, 3 * row_bytes), 0);
  EXPECT_EQ(std::memcmp(b + 3 * row_bytes, a, 3 * row_bytes), 0);
  // Rows that do not split into the rule's parts: an error naming the tensor and its shape.
  source->tensors["blk.0.qkv"] = Tensor::view_of(host_allocate(4 * row_bytes), {4, cols}, DType::q8_0);
  test::expect_error([&] { (void)nn::KeyMappedSource(source, map); }, {"memory", "'blk.0.qkv'", "[4,64]", "3 equal parts"});
}

// ---------------------------------------------------------------- SD3

TEST(OriginalKeysSd3, RoundTripKeepsEveryTensorUnderTheStabilityNames) {
  const Scratch scratch;
  const RoundTrip r = round_trip(scratch, component_dir("sd3_tiny", "transformer"),
                                 original_key_map(io::Layout::sd3_stability), "transformer");
  // sd3_tiny: one block (the last, context pre-only), no QK norm, no dual attention.
  const std::string x = "joint_blocks.0.x_block.", c = "joint_blocks.0.context_block.";
  EXPECT_EQ(file_keys(r.file),
            sorted_keys({{"pos_embed"}, wb("x_embedder.proj"), wb("t_embedder.mlp.0"), wb("t_embedder.mlp.2"),
                         wb("y_embedder.mlp.0"), wb("y_embedder.mlp.2"), wb("context_embedder"),
                         wb("final_layer.linear"), wb("final_layer.adaLN_modulation.1"), wb(x + "attn.qkv"),
                         wb(x + "attn.proj"), wb(x + "adaLN_modulation.1"), wb(x + "mlp.fc1"), wb(x + "mlp.fc2"),
                         wb(c + "attn.qkv"), wb(c + "adaLN_modulation.1")}));
  EXPECT_EQ(r.original->shape(x + "attn.qkv.weight"), (Shape{3 * 32, 32}));
  EXPECT_EQ(detect_original_layout(*r.original, "transformer").layout, io::Layout::sd3_stability);
  expect_same_tensors(*r.diffusers, *r.mapped);
}

TEST(OriginalKeysSd3, Sd35DualAttentionQkNormAndTheLastContextBlock) {
  const Scratch scratch;
  const RoundTrip r = round_trip(scratch, component_dir("sd35_tiny_arch", "transformer"),
                                 original_key_map(io::Layout::sd3_stability), "transformer", "model.diffusion_model.");
  const auto keys = file_keys(r.file);
  const std::set<std::string> set(keys.begin(), keys.end());
  EXPECT_EQ(keys.size(), 85u - 5 * 4);  // five fused q, k, v (weight and bias): 6 tensors in 2, five times
  const std::string p = "model.diffusion_model.";
  for (const char* k : {"joint_blocks.0.x_block.attn2.qkv.weight", "joint_blocks.0.x_block.attn2.ln_q.weight",
                               "joint_blocks.0.context_block.attn.ln_k.weight", "joint_blocks.0.context_block.mlp.fc2.bias",
                               "joint_blocks.1.context_block.attn.qkv.bias"})
    EXPECT_TRUE(set.count(p + k)) << k;
  EXPECT_FALSE(set.count(p + "joint_blocks.1.context_block.attn.proj.weight")) << "pre-only: no output projection";
  EXPECT_FALSE(set.count(p + "joint_blocks.1.x_block.attn2.qkv.weight"));
  // Block 0's context modulation is stored as it is; the last block's, halves swapped.
  const auto& o = *r.original;
  const auto& d = *r.diffusers;
  EXPECT_EQ(stored_bytes(o, p + "joint_blocks.0.context_block.adaLN_modulation.1.weight"),
            stored_bytes(d, "transformer_blocks.0.norm1_context.linear.weight"));
  EXPECT_EQ(row_bytes(o, p + "joint_blocks.1.context_block.adaLN_modulation.1.weight", 0, 64),
            row_bytes(d, "transformer_blocks.1.norm1_context.linear.weight", 64, 128));
  expect_same_tensors(d, *r.mapped);
}

TEST(OriginalKeysSd3, ModelFromTheStabilityFileMatchesTheDiffusersFolder) {
  const Scratch scratch;
  const std::string set = "sd35_tiny_arch";
  const fs::path dir = component_dir(set, "transformer");
  const RoundTrip r = round_trip(scratch, dir, original_key_map(io::Layout::sd3_stability), "transformer");
  const SD3Transformer2DModel mapped(SD3TransformerConfig::from_json(io::JsonConfig(dir / "config.json")),
                                     nn::Weights(r.mapped));
  EXPECT_EQ(r.mapped->unread(), std::vector<std::string>{});
  const auto folder = SD3Transformer2DModel::from_pretrained(dir);
  const auto g = [&](const std::string& k) { return test::golden(set, k); };
  const auto run = [&](const SD3Transformer2DModel& m) {
    return m.forward(g("transformer.step0.in.hidden_states"), g("transformer.in.encoder_hidden_states"),
                     g("transformer.in.pooled_projections"), g("transformer.step0.in.timestep"));
  };
  EXPECT_EQ(max_abs_diff(run(mapped), run(folder)), 0.0);
}

// ---------------------------------------------------------------- LDM VAE

TEST(OriginalKeysVae, RoundTripRenumbersTheDecoderAndReadsAttentionConvsAsLinears) {
  const Scratch scratch;
  const RoundTrip r = round_trip(scratch, component_dir("sd35_tiny_arch", "vae"), original_key_map(io::Layout::ldm_vae),
                                 "vae", "first_stage_model.");
  const auto keys = file_keys(r.file);
  const std::set<std::string> set(keys.begin(), keys.end());
  EXPECT_EQ(keys.size(), 244u);
  const std::string p = "first_stage_model.";
  const auto& o = *r.original;
  const auto& d = *r.diffusers;
  EXPECT_EQ(o.shape(p + "encoder.mid.attn_1.q.weight"), (Shape{32, 32, 1, 1}));
  EXPECT_EQ(o.shape(p + "decoder.mid.attn_1.proj_out.weight"), (Shape{32, 32, 1, 1}));
  EXPECT_TRUE(set.count(p + "decoder.mid.attn_1.norm.bias"));
  EXPECT_TRUE(set.count(p + "encoder.norm_out.weight"));
  // Diffusers' up_blocks.3 (the last, 16 -> 8 channels) is LDM's up.0.
  EXPECT_EQ(o.shape(p + "decoder.up.0.block.0.nin_shortcut.weight"), (Shape{8, 16, 1, 1}));
  EXPECT_EQ(stored_bytes(o, p + "decoder.up.0.block.0.nin_shortcut.weight"),
            stored_bytes(d, "decoder.up_blocks.3.resnets.0.conv_shortcut.weight"));
  EXPECT_EQ(stored_bytes(o, p + "decoder.up.3.block.2.conv1.weight"),
            stored_bytes(d, "decoder.up_blocks.0.resnets.2.conv1.weight"));
  EXPECT_TRUE(set.count(p + "decoder.up.3.upsample.conv.weight"));
  EXPECT_FALSE(set.count(p + "decoder.up.0.upsample.conv.weight")) << "the last Diffusers up block does not upsample";
  EXPECT_TRUE(set.count(p + "encoder.down.0.downsample.conv.bias"));
  EXPECT_FALSE(set.count(p + "encoder.down.3.downsample.conv.bias"));
  const io::DetectedLayout layout = detect_original_layout(o, "vae");
  EXPECT_EQ(layout.layout, io::Layout::ldm_vae);
  EXPECT_EQ(layout.prefix, p);
  expect_same_tensors(d, *r.mapped);

  // FLUX.1-tiny's one-block VAE: up.0 is up_blocks.0.
  const RoundTrip tiny =
      round_trip(scratch, component_dir("flux1_tiny", "vae"), original_key_map(io::Layout::ldm_vae), "vae");
  EXPECT_TRUE(io::SafetensorsFile(tiny.file).contains("decoder.up.0.block.0.conv1.weight"));
  expect_same_tensors(*tiny.diffusers, *tiny.mapped);
}

TEST(OriginalKeysVae, ModelFromTheLdmFileMatchesTheDiffusersFolder) {
  const Scratch scratch;
  const std::string set = "sd35_tiny_arch";
  const fs::path dir = component_dir(set, "vae");
  const RoundTrip r = round_trip(scratch, dir, original_key_map(io::Layout::ldm_vae), "vae", "first_stage_model.");
  std::optional<AutoencoderKL> mapped;
  {
    nn::CheckpointAudit audit;
    mapped.emplace(VaeConfig::from_json(io::JsonConfig(dir / "config.json")),
                   nn::Weights(open_component_file(r.file, "vae")));
    EXPECT_EQ(audit.unused(AutoencoderKL::checkpoint_keys_not_loaded()), std::vector<std::string>{});
  }
  const auto folder = AutoencoderKL::from_pretrained(dir);
  const Tensor z = test::golden(set, "vae.decode.in");
  EXPECT_EQ(max_abs_diff(mapped->decode(z), folder.decode(z)), 0.0);
  const Tensor image = test::random_tensor({1, 3, 32, 32}, 7, DType::f32, -1, 1);
  EXPECT_EQ(max_abs_diff(mapped->encode_mean(image), folder.encode_mean(image)), 0.0);
}

// ---------------------------------------------------------------- FLUX.2

TEST(OriginalKeysFlux2, RoundTripKeepsEveryTensorUnderTheBflNames) {
  const Scratch scratch;
  for (const std::string set : {"flux2_tiny", "flux2_klein_tiny"}) {
    const RoundTrip r =
        round_trip(scratch, component_dir(set, "transformer"), original_key_map(io::Layout::flux2_bfl), "transformer");
    const auto keys = file_keys(r.file);
    const std::set<std::string> s(keys.begin(), keys.end());
    for (const char* k : {"single_stream_modulation.lin.weight", "double_stream_modulation_img.lin.weight",
                                 "double_blocks.0.img_mlp.0.weight", "single_blocks.0.norm.key_norm.scale",
                                 "final_layer.adaLN_modulation.1.weight", "time_in.in_layer.weight"})
      EXPECT_TRUE(s.count(k)) << set << " " << k;
    EXPECT_EQ(s.count("guidance_in.in_layer.weight"), set == "flux2_tiny" ? 1u : 0u) << set;
    EXPECT_EQ(r.diffusers->names().size(), keys.size() + 4) << set << ": two fused q, k, v";
    EXPECT_EQ(detect_original_layout(*r.original, "transformer").layout, io::Layout::flux2_bfl) << set;
    expect_same_tensors(*r.diffusers, *r.mapped);
  }
}

TEST(OriginalKeysFlux2, ModelFromTheBflFileMatchesTheDiffusersFolder) {
  const Scratch scratch;
  const std::string set = "flux2_tiny";
  const fs::path dir = component_dir(set, "transformer");
  const RoundTrip r = round_trip(scratch, dir, original_key_map(io::Layout::flux2_bfl), "transformer");
  const Flux2Transformer2DModel mapped(Flux2TransformerConfig::from_json(io::JsonConfig(dir / "config.json")),
                                       nn::Weights(r.mapped));
  EXPECT_EQ(r.mapped->unread(), std::vector<std::string>{});
  const auto folder = Flux2Transformer2DModel::from_pretrained(dir);
  const auto g = [&](const std::string& k) { return test::golden(set, k); };
  const auto run = [&](const Flux2Transformer2DModel& m) {
    return m.forward(g("transformer.step0.in.hidden_states"), g("transformer.in.encoder_hidden_states"),
                     g("transformer.step0.in.timestep"), g("transformer.in.img_ids"), g("transformer.in.txt_ids"),
                     g("transformer.in.guidance"));
  };
  const Tensor got = run(mapped);
  EXPECT_EQ(max_abs_diff(got, run(folder)), 0.0);
  EXPECT_LE(max_abs_diff(got, g("transformer.step0.out")), 1e-5) << "and Diffusers' own output";
}

}  // namespace
}  // namespace kiln
