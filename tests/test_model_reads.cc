// random_checkpoint/model_reads.h: a random checkpoint is what the model reads, with values drawn
// by how each tensor is read.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "core/error.h"
#include "nn/layers.h"
#include "random_checkpoint/model_reads.h"

namespace kiln {
namespace {

namespace rw = random_weights;

const rw::RandomTensor& find(const std::vector<rw::RandomTensor>& ts, const std::string& name) {
  for (const rw::RandomTensor& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

void expect_init(const rw::RandomTensor& t, rw::Init::Kind kind, double value) {
  EXPECT_EQ(t.init.kind, kind) << t.name;
  EXPECT_NEAR(t.init.value, value, 1e-12) << t.name;
}

TEST(ModelReads, EachTensorIsDrawnByHowTheModelReadsIt) {
  rw::ReadRules rules;
  rules.gains = rw::residual_gains({"ff.out"}, 4);  // 1/2
  rules.inits = {{"table.weight", rw::Init::uniform(0.1)}};
  rules.unread = {{"steps", {}, rw::Init::constant(0), DType::i64}};
  const std::vector<rw::RandomTensor> ts = rw::tensors_read(
      [](const nn::Weights& w) {
        nn::Linear(w.sub("proj"), 16, 32);
        nn::Linear(w.sub("blocks.0.ff.out"), 64, 8, /*bias=*/false);
        nn::Linear(w.sub("ff.out"), 64, 8, /*bias=*/false);  // the model's own output: no branch gain
        nn::LayerNorm(w.sub("norm"), 32, 1e-6);
        nn::Conv2d(w.sub("conv"), 3, 8, 3);
        nn::Embedding(w.sub("embed"), 100, 32);
        nn::Embedding(w.sub("table"), 10, 4);
        (void)w.get("bn.running_var", {8});
        EXPECT_FALSE(w.has("absent.weight"));  // never read, not declared present
        EXPECT_TRUE(w.has("proj.weight"));      // read already
      },
      rules);
  const std::vector<std::string> order{"proj.weight", "proj.bias", "blocks.0.ff.out.weight", "ff.out.weight",
                                       "norm.weight", "norm.bias", "conv.weight", "conv.bias",
                                       "embed.weight", "table.weight", "bn.running_var", "steps"};
  ASSERT_EQ(ts.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(ts[i].name, order[i]);  // the order it reads them in
  EXPECT_EQ(find(ts, "proj.weight").shape, (Shape{32, 16}));
  EXPECT_EQ(find(ts, "conv.weight").shape, (Shape{8, 3, 3, 3}));
  using K = rw::Init::Kind;
  expect_init(find(ts, "proj.weight"), K::uniform, 1 / std::sqrt(16.0));
  expect_init(find(ts, "proj.bias"), K::uniform, rw::kBiasStd);
  expect_init(find(ts, "blocks.0.ff.out.weight"), K::uniform, 0.5 / std::sqrt(64.0));
  expect_init(find(ts, "ff.out.weight"), K::uniform, 1 / std::sqrt(64.0));
  expect_init(find(ts, "norm.weight"), K::constant, 1);
  expect_init(find(ts, "norm.bias"), K::constant, 0);
  expect_init(find(ts, "conv.weight"), K::uniform, 1 / std::sqrt(27.0));
  expect_init(find(ts, "conv.bias"), K::uniform, rw::kBiasStd);
  expect_init(find(ts, "embed.weight"), K::uniform, 1);
  expect_init(find(ts, "table.weight"), K::uniform, 0.1);
  expect_init(find(ts, "bn.running_var"), K::constant, 1);
  EXPECT_EQ(find(ts, "steps").dtype, DType::i64);
}

TEST(ModelReads, DeclaredPresentKeysLetTheModelBuildWhatItLooksFor) {
  const auto build = [](const nn::Weights& w) {
    if (w.has("encoder.conv_in.weight")) nn::Conv2d(w.sub("encoder.conv_in"), 3, 4, 3);
    nn::Conv2d(w.sub("decoder.conv_in"), 4, 3, 3);
  };
  EXPECT_EQ(rw::tensors_read(build, {}).size(), 2u);
  rw::ReadRules rules;
  rules.present = {"encoder.conv_in.weight"};
  EXPECT_EQ(rw::tensors_read(build, rules).size(), 4u);
}

}  // namespace
}  // namespace kiln
