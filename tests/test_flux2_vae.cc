// AutoencoderKLFlux2 (flux2.md §4) against Diffusers' outputs (tests/fixtures/flux2_tiny): loading
// with its batch-norm statistics and patch size, the decoder within 1e-5, and the pipeline's
// latents -> VAE input transform (flux2.md §6 step 5: unpack, BN de-normalisation, unpatchify)
// within 1e-6; plus the transforms' own properties and the loader's errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "exec/host.h"
#include "exec/ops.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/vae/autoencoder_kl.h"
#include "models/vae/flux2_latents.h"
#include "nn/weight_source.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
namespace fl = flux2_latents;

const std::string kSet = "flux2_tiny";

const AutoencoderKL& flux2_vae() {
  static const auto m =
      std::make_unique<AutoencoderKL>(AutoencoderKL::from_pretrained(test::pipeline_dir(kSet) / "vae"));
  return *m;
}

double max_abs_error(const Tensor& a, const Tensor& b) {
  const auto x = to_vector(a), y = to_vector(b);
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::fabs(double(x[i]) - y[i]));
  return worst;
}

TEST(Flux2Vae, LoadsConfigBatchNormStatisticsAndPatchSize) {
  const AutoencoderKL& vae = flux2_vae();
  const VaeConfig& c = vae.config();
  EXPECT_EQ(c.class_name, "AutoencoderKLFlux2");
  EXPECT_TRUE(c.has_latent_batch_norm());
  EXPECT_EQ(c.latent_channels, 1);
  EXPECT_EQ(c.block_out_channels, std::vector<int64_t>{4});
  EXPECT_EQ(c.decoder_channels(), std::vector<int64_t>{4});  // decoder_block_out_channels is null
  EXPECT_DOUBLE_EQ(c.batch_norm_eps, 1e-4);
  EXPECT_DOUBLE_EQ(c.batch_norm_momentum, 0.1);
  EXPECT_DOUBLE_EQ(c.scaling_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.shift_factor, 0.0);
  EXPECT_FALSE(c.use_quant_conv);
  EXPECT_FALSE(c.use_post_quant_conv);
  EXPECT_EQ(vae.patch_size(), (std::array<int64_t, 2>{2, 2}));
  EXPECT_EQ(c.batch_norm_channels(), 4);
  EXPECT_EQ(c.vae_scale_factor(), 1);

  ASSERT_TRUE(vae.latent_batch_norm().has_value());
  const LatentBatchNorm& bn = *vae.latent_batch_norm();
  EXPECT_DOUBLE_EQ(bn.eps, 1e-4);
  EXPECT_EQ(bn.running_mean.shape(), Shape{4});
  EXPECT_EQ(bn.running_var.shape(), Shape{4});
  // The values the manifest records (derived.vae_bn), stored as f32.
  const std::vector<float> mean{0.0230652317404747f, 0.2012014091014862f, -0.5057645440101624f, 0.1083691194653511f};
  const std::vector<float> var{1.5107091665267944f, 0.9971929788589478f, 1.6755620241165161f, 1.3445948362350464f};
  EXPECT_EQ(to_vector(bn.running_mean), mean);
  EXPECT_EQ(to_vector(bn.running_var), var);

  // bn.num_batches_tracked (int64) is left unread on purpose.
  EXPECT_TRUE(nn::key_under("bn.num_batches_tracked", AutoencoderKL::checkpoint_keys_not_loaded()));
}

TEST(Flux2Vae, EveryCheckpointTensorIsReadOrDeclaredUnread) {
  // What the pipeline loader audits: no unread tensor outside checkpoint_keys_not_loaded().
  nn::CheckpointAudit audit;
  const AutoencoderKL vae = AutoencoderKL::from_pretrained(test::pipeline_dir(kSet) / "vae");
  EXPECT_TRUE(vae.latent_batch_norm().has_value());
  const auto unused = audit.unused(AutoencoderKL::checkpoint_keys_not_loaded());
  EXPECT_TRUE(unused.empty()) << (unused.empty() ? "" : unused.front());
  // Only the encoder half and the step counter are unread.
  const auto all = audit.unused({});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_NE(all[0].find("bn.num_batches_tracked"), std::string::npos) << all[0];
  EXPECT_EQ(all[0].find("bn.running"), std::string::npos) << all[0];
}

TEST(Flux2Vae, PlainAutoencoderKlHasNoBatchNorm) {
  const VaeConfig c =
      VaeConfig::from_json(io::JsonConfig::from_string(R"({"_class_name": "AutoencoderKL"})", "vae.json"));
  EXPECT_FALSE(c.has_latent_batch_norm());
  EXPECT_EQ(c.patch_size, (std::array<int64_t, 2>{1, 1}));
  EXPECT_DOUBLE_EQ(c.scaling_factor, 0.18215);
}

TEST(Flux2Vae, DecodeMatchesDiffusers) {
  const Tensor out = flux2_vae().decode(test::golden(kSet, "vae.decode.in"));
  const Tensor want = test::golden(kSet, "vae.decode.out");
  test::expect_close(out, want, 1e-5, 0, "flux2_tiny vae.decode.out");
  std::cout << "[ info ] flux2_tiny vae.decode.out max abs error " << max_abs_error(out, want) << "\n";
}

TEST(Flux2Vae, PipelineLatentsToVaeInputMatchDiffusers) {
  // flux2.md §6 step 5: the final packed latents [1, 256, 4] -> unpack by img_ids -> x sqrt(var + eps)
  // + mean -> unpatchify -> the VAE's input [1, 1, 32, 32].
  const AutoencoderKL& vae = flux2_vae();
  const Tensor tokens = test::golden(kSet, "latents.after_step1");
  const Tensor ids = test::golden(kSet, "transformer.in.img_ids");
  const Tensor want = test::golden(kSet, "vae.decode.in");

  const Tensor got = fl::tokens_to_vae_latents(tokens, ids, *vae.latent_batch_norm(), vae.patch_size());
  test::expect_close(got, want, 1e-6, 0, "flux2_tiny vae.decode.in");
  std::cout << "[ info ] flux2_tiny vae.decode.in (from latents.after_step1) max abs error "
            << max_abs_error(got, want) << "\n";

  // The same, step by step, with the grid known instead of the ids.
  const Tensor step = fl::unpatchify(fl::bn_denormalize(fl::unpack(tokens, 16, 16), *vae.latent_batch_norm()),
                                     vae.patch_size());
  test::expect_close(step, want, 1e-6, 0, "flux2_tiny vae.decode.in (unpack by grid)");

  // And the other way: normalize(patchify(vae input)), packed, gives the latents back.
  const Tensor back = fl::pack(fl::bn_normalize(fl::patchify(want, vae.patch_size()), *vae.latent_batch_norm()));
  test::expect_close(back, tokens, 1e-5, 0, "flux2_tiny latents.after_step1 (round trip)");

  // End to end: the decode of the transformed latents.
  test::expect_close(vae.decode(got), test::golden(kSet, "vae.decode.out"), 1e-5, 0, "flux2_tiny decode of tokens");
}

TEST(Flux2Vae, PatchifyLayoutAndUnpatchifyIsItsInverse) {
  // flux2.md channel c·4 + dy·2 + dx holds z[c, 2Y + dy, 2X + dx].
  const Tensor z = test::random_tensor({2, 3, 6, 8}, 7);
  const Tensor p = fl::patchify(z);
  ASSERT_EQ(p.shape(), (Shape{2, 12, 3, 4}));
  const auto zv = to_vector(z), pv = to_vector(p);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t dy = 0; dy < 2; ++dy)
        for (int64_t dx = 0; dx < 2; ++dx)
          for (int64_t Y = 0; Y < 3; ++Y)
            for (int64_t X = 0; X < 4; ++X) {
              const float want = zv[size_t(((b * 3 + c) * 6 + 2 * Y + dy) * 8 + 2 * X + dx)];
              const float got = pv[size_t(((b * 12 + c * 4 + dy * 2 + dx) * 3 + Y) * 4 + X)];
              ASSERT_EQ(got, want) << b << " " << c << " " << dy << " " << dx << " " << Y << " " << X;
            }
  EXPECT_EQ(to_vector(fl::unpatchify(p)), zv);
  EXPECT_EQ(to_vector(fl::patchify(fl::unpatchify(p))), pv);
  // Non-square patches.
  const Tensor q = fl::patchify(z, {3, 2});
  EXPECT_EQ(q.shape(), (Shape{2, 18, 2, 4}));
  EXPECT_EQ(to_vector(fl::unpatchify(q, {3, 2})), zv);
  // Packing.
  EXPECT_EQ(to_vector(fl::unpack(fl::pack(p), 3, 4)), pv);
}

TEST(Flux2Vae, UnpackWithIdsScattersByPosition) {
  // Tokens given in reverse order with their ids land where the ids say; a missing position is 0.
  const int64_t h = 2, w = 3, c = 2;
  const Tensor grid = test::random_tensor({1, c, h, w}, 3);
  const auto tokens = to_vector(fl::pack(grid));  // [6, 2], row-major
  std::vector<float> rev;
  std::vector<int64_t> ids;
  for (int64_t i = h * w - 1; i >= 1; --i) {  // drops token 0, position (0, 0)
    rev.insert(rev.end(), tokens.begin() + i * c, tokens.begin() + (i + 1) * c);
    ids.insert(ids.end(), {0, i / w, i % w, 0});
  }
  const Tensor got = fl::unpack_with_ids(from_vector(rev, {1, h * w - 1, c}), from_ints(ids, {1, h * w - 1, 4}));
  auto want = to_vector(grid);
  want[0] = want[size_t(h * w)] = 0;  // position (0, 0) of both channels
  EXPECT_EQ(to_vector(got), want);
  const Tensor same = from_ints(std::vector<int64_t>(ids.size(), 0), {1, h * w - 1, 4});
  test::expect_error([&] { fl::unpack_with_ids(from_vector(rev, {1, h * w - 1, c}), same); },
                     {"[flux2 latents]", "both have position (0, 0)"});
}

TEST(Flux2Vae, TransformsRejectMismatchedShapes) {
  const LatentBatchNorm& bn = *flux2_vae().latent_batch_norm();
  test::expect_error([&] { fl::bn_denormalize(zeros({1, 8, 4, 4}), bn); },
                     {"[flux2 latents]", "bn_denormalize expects patchified latents [B, 4, h, w]", "[1,8,4,4]"});
  test::expect_error([] { fl::patchify(zeros({1, 1, 5, 4})); }, {"[flux2 latents]", "patchify", "[1,1,5,4]"});
  test::expect_error([] { fl::unpatchify(zeros({1, 6, 4, 4})); }, {"[flux2 latents]", "unpatchify", "[1,6,4,4]"});
}

TEST(Flux2Vae, BfloatStatisticsFollowTheBufferDtype) {
  // flux2.md §4 [QUIRK]: sqrt(var + eps) is rounded in the statistics' dtype, then cast.
  const LatentBatchNorm& bn32 = *flux2_vae().latent_batch_norm();
  const LatentBatchNorm bn16{cast(bn32.running_mean, DType::bf16), cast(bn32.running_var, DType::bf16), bn32.eps};
  const Tensor x = ones({1, 4, 1, 1});
  const auto got = to_vector(fl::bn_denormalize(x, bn16));
  const auto mean = to_vector(bn16.running_mean);
  const auto std16 = to_vector(sqrt(bn16.running_var + bn16.eps));  // bf16 arithmetic
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], std16[i] + mean[i]) << i;
}

// A scratch copy of the tiny FLUX.2 vae folder whose checkpoint or config can be edited.
class Flux2VaeErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_flux2_vae_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    src_ = test::pipeline_dir(kSet) / "vae";
    fs::copy_file(src_ / "config.json", dir_ / "config.json", fs::copy_options::overwrite_existing);
    std::ifstream in(src_ / "config.json");
    config_.assign(std::istreambuf_iterator<char>(in), {});
  }
  void TearDown() override { fs::remove_all(dir_); }
  // The checkpoint with `key` replaced by `value` (or dropped when undefined).
  void write_weights(const std::string& key, const Tensor& value) {
    io::SafetensorsFile f(src_ / "diffusion_pytorch_model.safetensors");
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& name : f.names()) {
      if (name != key) tensors.emplace_back(name, contiguous(f.load(name)));
      else if (value.defined()) tensors.emplace_back(name, value);
    }
    io::save_safetensors(dir_ / "diffusion_pytorch_model.safetensors", tensors);
  }
  void write_config(const std::string& from, const std::string& to) {
    std::string text = config_;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(dir_ / "config.json") << text;
  }
  fs::path dir_, src_;
  std::string config_;
};

TEST_F(Flux2VaeErrors, BatchNormStatisticOfTheWrongLengthNamesTheTensor) {
  write_weights("bn.running_var", zeros({8}));
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); }, {"[weights]", "bn.running_var", "[8]", "[4]"});
  try {
    AutoencoderKL::from_pretrained(dir_);
  } catch (const Error& e) {
    std::cout << "[ info ] " << e.what() << "\n";
  }
}

TEST_F(Flux2VaeErrors, MissingBatchNormStatisticIsNamed) {
  write_weights("bn.running_mean", Tensor());
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); }, {"bn.running_mean", "missing"});
}

TEST_F(Flux2VaeErrors, NegativeVarianceIsRefused) {
  write_weights("bn.running_var", from_vector({1, 1, -1, 1}, {4}));
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); },
                     {"[vae]", "bn.running_var", "entry 2", "var + batch_norm_eps > 0"});
}

TEST_F(Flux2VaeErrors, PatchSizeThatDisagreesWithTheStatisticsNamesTheTensor) {
  write_weights("", Tensor());
  write_config("\"patch_size\": [\n    2,\n    2\n  ]", "\"patch_size\": [1, 2]");
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); }, {"[weights]", "bn.running_mean", "[4]", "[2]"});
}

TEST_F(Flux2VaeErrors, BadConfigFieldsNameTheFileAndField) {
  write_weights("", Tensor());
  write_config("\"patch_size\": [\n    2,\n    2\n  ]", "\"patch_size\": [2]");
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); }, {"[vae]", "config.json", "'patch_size'"});
  write_config("\"batch_norm_eps\": 0.0001", "\"batch_norm_eps\": -1");
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); }, {"[vae]", "config.json", "'batch_norm_eps'"});
  write_config("\"AutoencoderKLFlux2\"", "\"AutoencoderKLWan\"");
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); },
                     {"[vae]", "config.json", "'_class_name'", "AutoencoderKLWan"});
  write_config("\"decoder_block_out_channels\": null", "\"decoder_block_out_channels\": [4, 4]");
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); },
                     {"[vae]", "config.json", "'decoder_block_out_channels'"});
}

TEST(Flux2Vae, ClassDefaultsWhenFieldsAreAbsent) {
  const VaeConfig c =
      VaeConfig::from_json(io::JsonConfig::from_string(R"({"_class_name": "AutoencoderKLFlux2"})", "vae.json"));
  EXPECT_EQ(c.latent_channels, 32);
  EXPECT_EQ(c.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(c.layers_per_block, 2);
  EXPECT_EQ(c.norm_num_groups, 32);
  EXPECT_EQ(c.sample_size, 1024);
  EXPECT_EQ(c.batch_norm_channels(), 128);
  EXPECT_EQ(c.vae_scale_factor(), 8);
  EXPECT_TRUE(c.use_quant_conv && c.use_post_quant_conv);
  const VaeConfig small = VaeConfig::from_json(io::JsonConfig::from_string(
      R"({"_class_name": "AutoencoderKLFlux2", "decoder_block_out_channels": [96, 192, 384, 384]})", "vae.json"));
  EXPECT_EQ(small.decoder_channels(), (std::vector<int64_t>{96, 192, 384, 384}));
  EXPECT_EQ(small.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
}

}  // namespace
}  // namespace kiln
