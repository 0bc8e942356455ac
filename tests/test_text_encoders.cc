// FLUX.1's text encoders (CLIPTextModel, T5EncoderModel) against transformers' own outputs in
// the fixtures: every hidden state, the last hidden state and CLIP's pooled output.
// Tolerance (manifest suggested_tolerances "fp32_text_encoders"): max abs error
// <= 1e-5 + 1e-4 * max|want| per tensor.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>

#include "exec/ops.h"
#include "exec/mode.h"
#include "exec/profile.h"
#include "golden.h"
#include "models/clip/clip_text_model.h"
#include "models/t5/t5_encoder.h"
#include "test_util.h"

namespace fs = std::filesystem;
using kiln::ClipPooledRule;
using kiln::ClipTextModel;
using kiln::T5EncoderModel;

namespace kiln {
namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;

double max_abs_err(const Tensor& got, const Tensor& want) {
  const auto g = to_vector(got), w = to_vector(want);
  double worst = 0;
  for (size_t i = 0; i < g.size() && i < w.size(); ++i) worst = std::max(worst, std::fabs(double(g[i]) - w[i]));
  return worst;
}

// expect_close with the observed max error printed, so the run log shows the margins.
void check(const Tensor& got, const std::string& set, const std::string& key) {
  const Tensor want = test::golden(set, key);
  test::expect_close(got, want, kAtol, kRtol, set + " " + key);
  if (got.shape() == want.shape()) std::printf("  %-16s %-24s max abs err %.3g\n", set.c_str(), key.c_str(),
                                               max_abs_err(got, want));
}

// The golden ids twice, once behind a different row, to check rows stay independent.
Tensor batch_of_two(const Tensor& ids, int64_t other_id) {
  const int64_t L = ids.dim(1);
  std::vector<int64_t> v(size_t(L), other_id);
  const auto golden = to_int_vector(ids);
  v.insert(v.end(), golden.begin(), golden.end());
  return from_ints(v, {2, L});
}

class TextEncoderGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TextEncoderGolden, ClipMatchesTransformers) {
  const std::string set = GetParam();
  const auto model = ClipTextModel::from_pretrained(test::pipeline_dir(set) / "text_encoder");
  const auto out = model.forward(test::golden(set, "clip.input_ids"), /*output_hidden_states=*/true);
  ASSERT_EQ(int64_t(out.hidden_states.size()), model.config().num_hidden_layers + 1);
  for (size_t i = 0; i < out.hidden_states.size(); ++i)
    check(out.hidden_states[i], set, "clip.hidden_states." + std::to_string(i));
  check(out.last_hidden_state, set, "clip.last_hidden_state");
  check(out.pooler_output, set, "clip.pooler_output");
}

TEST_P(TextEncoderGolden, ClipBatchRowsAreIndependent) {
  const std::string set = GetParam();
  const auto model = ClipTextModel::from_pretrained(test::pipeline_dir(set) / "text_encoder");
  const auto out = model.forward(batch_of_two(test::golden(set, "clip.input_ids"), 7));
  EXPECT_TRUE(out.hidden_states.empty());
  check(slice(out.last_hidden_state, 0, 1, 2), set, "clip.last_hidden_state");
  check(slice(out.pooler_output, 0, 1, 2), set, "clip.pooler_output");
}

// FLUX.1 takes only CLIP's pooled output, and pooled_output() encodes only the ids up to the
// pooled token (causal attention: later tokens cannot change it): transformers' pooled output
// within the golden tolerance, the full forward's within rounding, and every linear ran on that
// many rows, not the padded length (the profile's operand shapes). A batch whose rows pool at
// different positions keeps the later one.
TEST_P(TextEncoderGolden, ClipPooledOutputEncodesOnlyUpToThePooledToken) {
  const std::string set = GetParam();
  const auto model = ClipTextModel::from_pretrained(test::pipeline_dir(set) / "text_encoder");
  const Tensor ids = test::golden(set, "clip.input_ids");
  const int64_t L = ids.dim(1), E = model.config().hidden_size;
  const int64_t pos = ClipTextModel::pooled_positions(to_int_vector(ids), 1, L, model.config().eos_token_id,
                                                      model.config().pooled_rule)[0];
  ASSERT_LT(pos + 1, L);  // the fixture's prompt is shorter than the padded sequence
  Tensor pooled;
  {
    const EagerModeGuard strict(EagerMode::DeferNever);  // each op its own launch (deferred mode fuses them)
    reset_profile();
    set_profiling(true, ProfileDetail::shapes);
    pooled = model.pooled_output(ids);
    wait(pooled);
    set_profiling(false);
  }
  check(pooled, set, "clip.pooler_output");
  EXPECT_LE(max_abs_err(pooled, model.forward(ids).pooler_output), 1e-5);
  size_t linears = 0;
  for (const ProfiledLaunch& l : profile().launches) {
    if (l.op != "linear") continue;
    linears += l.cost.launches;
    EXPECT_EQ(numel(l.shapes[0]) / l.shapes[0].back(), pos + 1) << l.signature();
  }
  EXPECT_EQ(linears, size_t(6 * model.config().num_hidden_layers));  // q, k, v, out, fc1, fc2
  // Two rows: the golden row behind a row of id 7 (no end token: it pools at 0): both rows kept
  // up to the golden row's end token, the golden row's pooled output unchanged.
  const Tensor two = model.pooled_output(batch_of_two(ids, 7));
  check(slice(two, 0, 1, 2), set, "clip.pooler_output");
  EXPECT_EQ(two.dim(0), 2);
  EXPECT_EQ(two.dim(1), E);
}

TEST_P(TextEncoderGolden, T5MatchesTransformers) {
  const std::string set = GetParam();
  const auto model = T5EncoderModel::from_pretrained(test::pipeline_dir(set) / "text_encoder_2");
  const auto out = model.forward(test::golden(set, "t5.input_ids"), /*output_hidden_states=*/true);
  ASSERT_EQ(int64_t(out.hidden_states.size()), model.config().num_layers + 1);
  for (size_t i = 0; i < out.hidden_states.size(); ++i)
    check(out.hidden_states[i], set, "t5.hidden_states." + std::to_string(i));
  check(out.last_hidden_state, set, "t5.last_hidden_state");
}

TEST_P(TextEncoderGolden, T5BatchRowsAreIndependent) {
  const std::string set = GetParam();
  const auto model = T5EncoderModel::from_pretrained(test::pipeline_dir(set) / "text_encoder_2");
  const auto out = model.forward(batch_of_two(test::golden(set, "t5.input_ids"), 3));
  check(slice(out.last_hidden_state, 0, 1, 2), set, "t5.last_hidden_state");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TextEncoderGolden, ::testing::Values("flux1_tiny", "flux1_tiny_arch"));

// The tables of spec §4.2 (NB 32 / max distance 128 for T5-XXL, NB 8 for the tiny model).
TEST(TextEncoders, T5BucketsMatchSpecTables) {
  auto bucket32 = [](int64_t rel) { return T5EncoderModel::relative_position_bucket(rel, 32, 128); };
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{8, 11},  {12, 15}, {16, 22}, {23, 31},
                                                           {32, 45}, {46, 63}, {64, 90}, {91, 600}};
  EXPECT_EQ(bucket32(0), 0);
  for (int64_t a = 1; a <= 7; ++a) {
    EXPECT_EQ(bucket32(-a), a);
    EXPECT_EQ(bucket32(a), 16 + a);
  }
  for (size_t r = 0; r < ranges.size(); ++r)
    for (int64_t a = ranges[r].first; a <= ranges[r].second; ++a) {
      EXPECT_EQ(bucket32(-a), int64_t(8 + r)) << "rel " << -a;
      EXPECT_EQ(bucket32(a), int64_t(24 + r)) << "rel " << a;
    }
  auto bucket8 = [](int64_t rel) { return T5EncoderModel::relative_position_bucket(rel, 8, 128); };
  EXPECT_EQ(bucket8(0), 0);
  EXPECT_EQ(bucket8(-1), 1);
  EXPECT_EQ(bucket8(1), 5);
  for (int64_t a = 2; a <= 15; ++a) {
    EXPECT_EQ(bucket8(-a), 2);
    EXPECT_EQ(bucket8(a), 6);
  }
  for (int64_t a = 16; a <= 600; ++a) {
    EXPECT_EQ(bucket8(-a), 3);
    EXPECT_EQ(bucket8(a), 7);
  }
}

// the fixtures' reference (transformers 4.52, eos_token_id 2) pooled at argmax(ids) = 9;
// the other rule would take position 0 there (no id 2 and max id 999 != 49407).
TEST(TextEncoders, ClipPooledRules) {
  const auto ids = to_int_vector(test::golden("flux1_tiny", "clip.input_ids"));
  const int64_t L = int64_t(ids.size());
  EXPECT_EQ(ClipTextModel::pooled_positions(ids, 1, L, 2, ClipPooledRule::eos2_argmax), std::vector<int64_t>{9});
  EXPECT_EQ(ClipTextModel::pooled_positions(ids, 1, L, 2, ClipPooledRule::max_id_49407_argmax),
            std::vector<int64_t>{0});
  // Real CLIP ids: both rules pick the first <|endoftext|> (49407), padding included.
  const std::vector<int64_t> real = {49406, 320, 1125, 49407, 49407, 49406, 49407, 49407, 0, 0};
  for (auto rule : {ClipPooledRule::eos2_argmax, ClipPooledRule::max_id_49407_argmax})
    EXPECT_EQ(ClipTextModel::pooled_positions(real, 2, 5, 49407, rule), (std::vector<int64_t>{3, 1}));
}

// A copy of a fixture component whose config.json is edited by `edit`.
class TextEncoderErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kiln_textenc_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  template <typename Edit>
  fs::path edited(const std::string& component, Edit edit) {
    fs::copy(test::pipeline_dir("flux1_tiny") / component, dir_, fs::copy_options::recursive);
    nlohmann::json j;
    std::ifstream(dir_ / "config.json") >> j;
    edit(j);
    std::ofstream(dir_ / "config.json") << j.dump(2);
    return dir_;
  }
  fs::path dir_;
};

TEST_F(TextEncoderErrors, ClipHiddenSizeDisagreesWithWeights) {
  const auto dir = edited("text_encoder", [](nlohmann::json& j) { j["hidden_size"] = 64; });
  test::expect_error([&] { ClipTextModel::from_pretrained(dir); },
                     {"text_model.embeddings.token_embedding.weight", "[1000,32]", "[1000,64]"});
}

TEST_F(TextEncoderErrors, ClipHeadsMustDivideHiddenSize) {
  const auto dir = edited("text_encoder", [](nlohmann::json& j) { j["num_attention_heads"] = 5; });
  test::expect_error([&] { ClipTextModel::from_pretrained(dir); },
                     {"[clip_text_model]", "config.json", "hidden_size 32", "num_attention_heads 5"});
}

TEST_F(TextEncoderErrors, ClipSequenceLongerThanPositions) {
  const auto model = ClipTextModel::from_pretrained(test::pipeline_dir("flux1_tiny") / "text_encoder");
  test::expect_error([&] { model.forward(from_ints(std::vector<int64_t>(78, 5), {1, 78})); },
                     {"[clip_text_model]", "78", "max_position_embeddings = 77"});
}

TEST_F(TextEncoderErrors, T5GatedConfigOnPlainWeights) {
  const auto dir = edited("text_encoder_2", [](nlohmann::json& j) {
    j["feed_forward_proj"] = "gated-gelu";
    j.erase("is_gated_act");
    j.erase("dense_act_fn");
  });
  test::expect_error([&] { T5EncoderModel::from_pretrained(dir); },
                     {"encoder.block.0.layer.1.DenseReluDense.wi_0.weight", "missing", "[37,32]"});
}

TEST_F(TextEncoderErrors, T5FeedForwardSizeDisagreesWithWeights) {
  const auto dir = edited("text_encoder_2", [](nlohmann::json& j) { j["d_ff"] = 40; });
  test::expect_error([&] { T5EncoderModel::from_pretrained(dir); },
                     {"encoder.block.0.layer.1.DenseReluDense.wi.weight", "[37,32]", "[40,32]"});
}

TEST_F(TextEncoderErrors, T5BadFeedForwardProj) {
  const auto dir = edited("text_encoder_2", [](nlohmann::json& j) { j["feed_forward_proj"] = "gated-x-y"; });
  test::expect_error([&] { T5EncoderModel::from_pretrained(dir); }, {"[t5_encoder]", "feed_forward_proj", "gated-x-y"});
}

}  // namespace
}  // namespace kiln
