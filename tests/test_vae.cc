// AutoencoderKL and VaeImageProcessor against Diffusers' outputs (tests/fixtures/*/golden.safetensors):
// the decoder and its intermediates within max abs error 1e-4, the float postprocess exactly,
// the uint8 image within one level (counting the pixels that differ).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "exec/host.h"
#include "exec/ops.h"
#include "golden.h"
#include "models/vae/autoencoder_kl.h"
#include "pipelines/image_processor.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr double kDecodeAtol = 1e-4;  // fp32 parity target for the decoder and its intermediates

const AutoencoderKL& vae(const std::string& set) {
  static std::map<std::string, std::unique_ptr<AutoencoderKL>> models;
  auto& m = models[set];
  if (!m) m = std::make_unique<AutoencoderKL>(AutoencoderKL::from_pretrained(test::pipeline_dir(set) / "vae"));
  return *m;
}

double max_abs_error(const Tensor& a, const Tensor& b) {
  const auto x = to_vector(a), y = to_vector(b);
  double worst = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) worst = std::max(worst, std::fabs(double(x[i]) - y[i]));
  return worst;
}

TEST(Vae, ConfigOfBothFixtures) {
  const VaeConfig& tiny = vae("flux1_tiny").config();
  EXPECT_EQ(tiny.latent_channels, 1);
  EXPECT_EQ(tiny.block_out_channels, std::vector<int64_t>{4});
  EXPECT_EQ(tiny.norm_num_groups, 1);
  EXPECT_DOUBLE_EQ(tiny.scaling_factor, 1.5035);
  EXPECT_DOUBLE_EQ(tiny.shift_factor, 0.0609);
  EXPECT_EQ(tiny.vae_scale_factor(), 1);
  EXPECT_FALSE(tiny.use_quant_conv);
  EXPECT_FALSE(tiny.use_post_quant_conv);

  const VaeConfig& arch = vae("flux1_tiny_arch").config();
  EXPECT_EQ(arch.latent_channels, 16);
  EXPECT_EQ(arch.block_out_channels, (std::vector<int64_t>{8, 16, 32, 32}));
  EXPECT_EQ(arch.layers_per_block, 2);
  EXPECT_DOUBLE_EQ(arch.scaling_factor, 0.3611);
  EXPECT_DOUBLE_EQ(arch.shift_factor, 0.1159);
  EXPECT_EQ(arch.vae_scale_factor(), 8);
}

TEST(Vae, DefaultsWhenFieldsAreAbsent) {
  const VaeConfig c = VaeConfig::from_json(io::JsonConfig::from_string(R"({"shift_factor": null})", "vae.json"));
  EXPECT_EQ(c.latent_channels, 4);
  EXPECT_DOUBLE_EQ(c.scaling_factor, 0.18215);
  EXPECT_DOUBLE_EQ(c.shift_factor, 0.0);
  EXPECT_TRUE(c.use_quant_conv);
  EXPECT_EQ(c.vae_scale_factor(), 1);
}

class VaeGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(VaeGolden, DecodeAndIntermediatesMatchDiffusers) {
  const std::string set = GetParam();
  VaeTrace trace;
  const Tensor out = vae(set).decode(test::golden(set, "vae.decode.in"), &trace);
  const Tensor want = test::golden(set, "vae.decode.out");
  test::expect_close(out, want, kDecodeAtol, 0, set + " vae.decode.out");
  std::cout << "[ info ] " << set << " vae.decode.out max abs error " << max_abs_error(out, want) << "\n";
  size_t compared = 0;
  for (const auto& [name, t] : trace) {
    const std::string key = "vae.module." + name;
    if (!test::golden_file(set).contains(key)) continue;
    const Tensor g = test::golden(set, key);
    test::expect_close(t, g, kDecodeAtol, 0, set + " " + key);
    std::cout << "[ info ] " << set << " " << key << " max abs error " << max_abs_error(t, g) << "\n";
    ++compared;
  }
  // conv_in, mid_block, every up block, conv_norm_out, conv_out.
  EXPECT_EQ(compared, 4 + vae(set).config().block_out_channels.size()) << set;
}

TEST_P(VaeGolden, PostprocessMatchesDiffusersExactly) {
  const std::string set = GetParam();
  const Tensor img = image_processor::postprocess(test::golden(set, "vae.decode.out"));
  test::expect_close(img, test::golden(set, "image.postprocessed"), 0, 0, set + " image.postprocessed");
}

TEST_P(VaeGolden, Uint8FromGoldenDecodeMatchesPil) {
  const std::string set = GetParam();
  const auto got = image_processor::to_uint8_hwc(test::golden(set, "vae.decode.out"));
  const auto want = test::golden_u8(set, "image.uint8");
  ASSERT_EQ(got.size(), want.size());
  const auto [n, worst] = test::byte_diff(got, want);
  EXPECT_EQ(n, 0u) << set << ": " << n << " of " << want.size() << " bytes differ (max " << worst << ")";
}

TEST_P(VaeGolden, Uint8FromKilnDecodeWithinOneLevel) {
  const std::string set = GetParam();
  const Tensor out = vae(set).decode(test::golden(set, "vae.decode.in"));
  const auto got = image_processor::to_uint8_hwc(out);
  const auto want = test::golden_u8(set, "image.uint8");
  ASSERT_EQ(got.size(), want.size());
  const auto [n, worst] = test::byte_diff(got, want);
  EXPECT_LE(worst, 1) << set;
  // A 1e-4 decode error can only flip values that sit near a rounding boundary.
  EXPECT_LE(n, want.size() / 100) << set << ": " << n << " of " << want.size() << " bytes differ";
  std::cout << "[ info ] " << set << ": " << n << " of " << want.size() << " uint8 values differ from PIL (max "
            << worst << ")\n";
}

TEST_P(VaeGolden, EncoderShapeAndDeterminism) {
  // No golden for the encoder: check the shape of the mean and that two runs agree bit for bit.
  const std::string set = GetParam();
  const auto& m = vae(set);
  const Tensor image = test::golden(set, "vae.decode.out");
  const Tensor mean = m.encode_mean(image);
  const int64_t f = m.config().vae_scale_factor();
  EXPECT_EQ(mean.shape(), (Shape{1, m.config().latent_channels, image.dim(2) / f, image.dim(3) / f}));
  EXPECT_EQ(m.encode_moments(image).dim(1), 2 * m.config().latent_channels);
  const auto a = to_vector(mean), b = to_vector(m.encode_mean(image));
  EXPECT_EQ(a, b);
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VaeGolden, ::testing::Values("flux1_tiny", "flux1_tiny_arch"));

// A scratch copy of the tiny vae folder with an edited config.json.
class VaeErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_vae_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const fs::path src = test::pipeline_dir("flux1_tiny") / "vae";
    fs::copy_file(src / "diffusion_pytorch_model.safetensors", dir_ / "diffusion_pytorch_model.safetensors",
                  fs::copy_options::overwrite_existing);
    std::ifstream in(src / "config.json");
    config_.assign(std::istreambuf_iterator<char>(in), {});
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_config(const std::string& from, const std::string& to) {
    std::string text = config_;
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(dir_ / "config.json") << text;
  }
  fs::path dir_;
  std::string config_;
};

TEST_F(VaeErrors, ConfigThatDisagreesWithTheWeightsNamesTheTensor) {
  write_config("\"latent_channels\": 1", "\"latent_channels\": 16");
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); },
                     {"[weights]", "decoder.conv_in.weight", "[4,1,3,3]", "[4,16,3,3]"});
}

TEST_F(VaeErrors, MissingPostQuantConvIsNamed) {
  write_config("\"use_post_quant_conv\": false", "\"use_post_quant_conv\": true");
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); }, {"post_quant_conv.weight", "missing"});
}

TEST_F(VaeErrors, UnsupportedBlockTypeNamesTheFile) {
  write_config("\"UpDecoderBlock2D\"", "\"AttnUpDecoderBlock2D\"");
  test::expect_error([&] { AutoencoderKL::from_pretrained(dir_); },
                     {"[vae]", "config.json", "AttnUpDecoderBlock2D", "not supported"});
}

TEST(Vae, WrongLatentChannelsIsRejected) {
  test::expect_error([] { vae("flux1_tiny_arch").decode(zeros({1, 4, 8, 8})); },
                     {"[vae]", "decode expects latents [B, 16, h, w]", "[1,4,8,8]"});
  test::expect_error([] { vae("flux1_tiny_arch").encode_mean(zeros({1, 4, 8, 8})); },
                     {"[vae]", "encode expects an image [B, 3, H, W]"});
}

}  // namespace
}  // namespace kiln
