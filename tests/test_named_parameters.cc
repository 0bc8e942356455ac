// Modules' parameters come from the names they read (nn::ParameterRecorder), never from
// hand-kept lists: a transformer's named_parameters() are exactly its checkpoint's keys, each
// block's are its keys relative to the block, blocks of one structure list the same names, and
// compile_repeated_blocks compiles exactly the classes repeated_blocks() names.
#include <set>

#include "exec/compile.h"
#include "golden.h"
#include "io/safetensors.h"
#include "models/flux/flux_transformer.h"
#include "models/sd3/sd3_transformer.h"
#include "nn/weights.h"
#include "test_util.h"

namespace kiln {
namespace {

std::set<std::string> checkpoint_keys(const std::filesystem::path& dir) {
  std::set<std::string> keys;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors")
      for (const std::string& k : io::SafetensorsFile(e.path()).names()) keys.insert(k);
  return keys;
}

template <typename Model>
void expect_named_as_the_checkpoint(const Model& m, const std::filesystem::path& dir) {
  std::set<std::string> named;
  for (const auto& [key, t] : m.named_parameters()) {
    EXPECT_TRUE(named.insert(key).second) << key << " twice";
    EXPECT_TRUE(t.defined()) << key;
  }
  EXPECT_EQ(named, checkpoint_keys(dir));
  EXPECT_EQ(m.parameters().size(), m.named_parameters().size());
}

TEST(NamedParameters, FluxTransformerNamesAreItsCheckpointKeys) {
  const auto dir = test::pipeline_dir("flux1_tiny_arch") / "transformer";
  const FluxTransformer2DModel m = FluxTransformer2DModel::from_pretrained(dir);
  expect_named_as_the_checkpoint(m, dir);
  // Each block: its keys without the block's prefix, the same list for every block of a class.
  const auto& blocks = m.transformer_blocks();
  ASSERT_GE(blocks.size(), 2u);
  for (const auto& [key, t] : blocks[0].named_parameters()) EXPECT_EQ(key.find("transformer_blocks"), std::string::npos);
  std::vector<std::string> first, second;
  for (const auto& [key, t] : blocks[0].named_parameters()) first.push_back(key);
  for (const auto& [key, t] : blocks[1].named_parameters()) second.push_back(key);
  EXPECT_EQ(first, second);
  EXPECT_NE(first.end(), std::find(first.begin(), first.end(), "attn.to_q.weight"));
}

TEST(NamedParameters, SD3TransformerNamesAreItsCheckpointKeys) {
  const auto dir = test::pipeline_dir("sd35_tiny_arch") / "transformer";
  const SD3Transformer2DModel m = SD3Transformer2DModel::from_pretrained(dir);
  expect_named_as_the_checkpoint(m, dir);
  // The dual-attention block reads attn2, the context_pre_only last block no to_add_out.
  std::set<std::string> dual, last;
  for (const auto& [key, t] : m.transformer_blocks()[0].named_parameters()) dual.insert(key);
  for (const auto& [key, t] : m.transformer_blocks()[1].named_parameters()) last.insert(key);
  EXPECT_TRUE(dual.count("attn2.to_q.weight"));
  EXPECT_TRUE(dual.count("attn.to_add_out.weight"));
  EXPECT_FALSE(last.count("attn2.to_q.weight"));
  EXPECT_FALSE(last.count("attn.to_add_out.weight"));
}

// A recorder records what is loaded in its lifetime, nested ones each, with prefixes taken off.
TEST(NamedParameters, RecordersNestAndStripTheirPrefix) {
  const auto dir = test::pipeline_dir("flux1_tiny") / "transformer";
  const nn::Weights w(dir);
  const io::SafetensorsFile file(dir / "diffusion_pytorch_model.safetensors");
  const auto shape = [&](const std::string& key) { return file.info(key).shape; };
  nn::ParameterRecorder outer;
  {
    nn::ParameterRecorder inner;
    w.sub("proj_out").get("bias", shape("proj_out.bias"));
    w.sub("proj_out").get("bias", shape("proj_out.bias"));  // loaded twice: named once
    const nn::NamedParameters named = inner.named("proj_out");
    ASSERT_EQ(named.size(), 1u);
    EXPECT_EQ(named[0].first, "bias");
  }
  w.sub("norm_out").sub("linear").get("weight", shape("norm_out.linear.weight"));
  const nn::NamedParameters all = outer.named();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, "norm_out.linear.weight");  // sorted by key
  EXPECT_EQ(all[1].first, "proj_out.bias");
}

TEST(NamedParameters, CompileRepeatedBlocksCompilesTheListedClasses) {
  FluxTransformer2DModel m = FluxTransformer2DModel::from_pretrained(test::pipeline_dir("flux1_tiny_arch") / "transformer");
  m.compile_repeated_blocks();
  for (const auto& b : m.transformer_blocks()) EXPECT_TRUE(b.is_compiled());
  for (const auto& b : m.single_transformer_blocks()) EXPECT_TRUE(b.is_compiled());
  EXPECT_EQ(FluxTransformer2DModel::repeated_blocks(),
            (std::vector<std::string>{m.transformer_blocks()[0].class_name(),
                                      m.single_transformer_blocks()[0].class_name()}));
}

}  // namespace
}  // namespace kiln
