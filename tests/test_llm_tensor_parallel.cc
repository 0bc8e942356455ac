// CausalLMTextEncoder under tensor parallelism (transformers' plan for these LLMs: q/k/v and
// gate/up colwise, o_proj and down_proj rowwise): in one process, each rank's slices and the bytes
// it reads (detached ranks); and — when this binary runs under `mpirun -np 2` — the sharded text
// encoder against the single-process one, in every execution mode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "distributed/process_group.h"
#include "distributed/tensor_parallel.h"
#include "exec/compile.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "io/safetensors.h"
#include "golden.h"
#include "llm_test_models.h"
#include "models/llm/causal_lm_text_encoder.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

TensorParallelConfig tp_for(std::shared_ptr<ProcessGroup> group) { return TensorParallelConfig{DeviceMesh(std::move(group))}; }

size_t layer_bytes(const CausalLMTextEncoder& m) {
  size_t n = 0;
  for (const auto& [key, t] : m.named_parameters())
    if (key.find(".layers.") != std::string::npos) n += t.nbytes();
  return n;
}

// Loads `dir` whole and as rank `rank` of `group`; checks the rank reads and holds at most 0.55 of
// the decoder layers' weight bytes, and of all its weights (the token table is vocab_parallel; only
// the norms are replicated).
CausalLMTextEncoder check_rank_reads_its_slices(const fs::path& dir, const std::shared_ptr<ProcessGroup>& group) {
  io::reset_bytes_read();
  const CausalLMTextEncoder whole = CausalLMTextEncoder::from_pretrained(dir);
  const uint64_t whole_read = io::bytes_read();
  const size_t whole_layers = layer_bytes(whole);
  io::reset_bytes_read();
  CausalLMTextEncoder part = CausalLMTextEncoder::from_pretrained(dir, DType::f32, -1, tp_for(group));
  // What the rank read beyond the replicated tensors (read whole by every rank).
  const double read = double(io::bytes_read() - (whole_read - whole_layers)) / double(whole_layers);
  const double held = double(layer_bytes(part)) / double(whole_layers);
  EXPECT_LE(read, 0.55) << dir << " rank " << group->rank();
  EXPECT_LE(held, 0.55) << dir << " rank " << group->rank();
  // With the token table split by rows too, the whole model (only norms replicated) is about half.
  size_t all_whole = 0, all_part = 0;
  for (const auto& [key, t] : whole.named_parameters()) all_whole += t.nbytes();
  for (const auto& [key, t] : part.named_parameters()) all_part += t.nbytes();
  EXPECT_LE(double(all_part), 0.55 * double(all_whole)) << dir << " rank " << group->rank();
  std::printf("%s rank %d of %d: reads %.3f and holds %.3f of the layers' weight bytes\n",
              part.config().model_type.c_str(), group->rank(), group->size(), read, held);
  return part;
}

TEST(LlmTensorParallelPlan, EachRankReadsOnlyItsSlices) {
  const fs::path dir = test::write_tiny_lm(test::tiny_mistral3(2), "mistral3_tp_plan");
  const DecoderLMConfig c = CausalLMTextEncoder::from_pretrained(dir).config();
  for (int rank = 0; rank < 2; ++rank) {
    const CausalLMTextEncoder part = check_rank_reads_its_slices(dir, ProcessGroup::detached(rank, 2));
    const int64_t hd = c.head_dim;
    for (const auto& [key, t] : part.named_parameters()) {
      const auto ends = [&](const char* s) { return key.ends_with(s); };
      Shape want;
      if (ends("q_proj.weight")) want = {c.num_attention_heads * hd / 2, c.hidden_size};
      if (ends("k_proj.weight") || ends("v_proj.weight")) want = {c.num_key_value_heads * hd / 2, c.hidden_size};
      if (ends("o_proj.weight")) want = {c.hidden_size, c.num_attention_heads * hd / 2};
      if (ends("gate_proj.weight") || ends("up_proj.weight")) want = {c.intermediate_size / 2, c.hidden_size};
      if (ends("down_proj.weight")) want = {c.hidden_size, c.intermediate_size / 2};
      if (!want.empty()) {
        EXPECT_EQ(t.shape(), want) << key;
      }
    }
  }
  // Rank r's q_proj is rows [r·Q/2, (r+1)·Q/2) of the whole one: its own heads.
  const CausalLMTextEncoder whole = CausalLMTextEncoder::from_pretrained(dir);
  const CausalLMTextEncoder rank1 = CausalLMTextEncoder::from_pretrained(dir, DType::f32, -1,
                                                                         tp_for(ProcessGroup::detached(1, 2)));
  const std::string q = "model.language_model.layers.1.self_attn.q_proj.weight";
  const auto find = [&](const CausalLMTextEncoder& m) {
    for (const auto& [key, t] : m.named_parameters())
      if (key == q) return t;
    return Tensor();
  };
  const int64_t rows = c.num_attention_heads * c.head_dim;
  EXPECT_EQ(to_vector(find(rank1)), to_vector(slice(find(whole), 0, rows / 2, rows)));
  // 3 ranks cannot split 4 heads (nor 2 KV heads); 2 ranks cannot split the flux2_tiny fixture's
  // MLP (intermediate_size 37).
  test::expect_error(
      [&] { CausalLMTextEncoder::from_pretrained(dir, DType::f32, -1, tp_for(ProcessGroup::detached(0, 3))); },
      {"[tp]", "tp_degree (3) must divide num_attention_heads (4), num_key_value_heads (2)", "config.json"});
  test::expect_error(
      [&] {
        CausalLMTextEncoder::from_pretrained(test::pipeline_dir("flux2_tiny") / "text_encoder", DType::f32, -1,
                                             tp_for(ProcessGroup::detached(0, 2)));
      },
      {"[tp]", "intermediate_size (37)", "flux2_tiny/pipeline/text_encoder/config.json"});
  fs::remove_all(dir);
}

// transformers' plan, plus kiln's vocab_parallel token table.
TEST(LlmTensorParallelPlan, ThePlanIsTransformersPlanUnderTheCheckpointsPrefix) {
  std::vector<std::string> got;
  for (const TensorParallelEntry& e : CausalLMTextEncoder::tp_plan()) got.push_back(e.pattern + " " + e.style);
  EXPECT_EQ(got, (std::vector<std::string>{"layers.*.self_attn.q_proj colwise", "layers.*.self_attn.k_proj colwise",
                                           "layers.*.self_attn.v_proj colwise", "layers.*.self_attn.o_proj rowwise",
                                           "layers.*.mlp.gate_proj colwise", "layers.*.mlp.up_proj colwise",
                                           "layers.*.mlp.down_proj rowwise", "embed_tokens vocab_parallel"}));
}

// ---- two ranks (CTest tensor_parallel_two_ranks runs TwoRanks*, under mpirun -np 2) ----

class TwoRanksTextEncoder : public testing::Test {
 protected:
  void SetUp() override {
    // Anywhere but under mpirun -np 2 these fail rather than skip: a skip would pass.
    ASSERT_EQ(ProcessGroup::world()->size(), 2) << "runs under mpirun -np 2; in one process add "
                                                   "--gtest_filter=-TwoRanks*";
  }
};

// The sharded text encoder gives the single-process hidden states within atol 1e-4 (the
// all-reduce sums the ranks' partial products in another order), in strict eager, deferred and
// compiled mode, for the Mistral3 and Qwen3 layouts; each rank reads about half the layers.
TEST_F(TwoRanksTextEncoder, TheShardedTextEncoderGivesTheSingleProcessHiddenStates) {
  for (const test::TinyLM& tiny : {test::tiny_mistral3(2), test::tiny_qwen3(2)}) {
    const fs::path dir = test::write_tiny_lm(tiny, "llm_two_ranks");
    const CausalLMTextEncoder single = CausalLMTextEncoder::from_pretrained(dir);
    const CausalLMTextEncoder sharded = check_rank_reads_its_slices(dir, ProcessGroup::world());
    const int64_t B = 2, L = 9;
    std::vector<int64_t> ids(size_t(B * L)), mask(size_t(B * L), 1);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int64_t(i * 13 + 1) % single.config().vocab_size;
    mask[size_t(L - 1)] = mask[size_t(L)] = 0;  // row 0 right-padded, row 1 left-padded
    const Tensor id_t = from_ints(ids, {B, L}), mask_t = from_ints(mask, {B, L});
    const std::vector<int64_t> layers = {1, 2};
    const std::vector<Tensor> want = single.hidden_states(id_t, mask_t, layers);
    for (const std::string mode : {"eager", "defer", "compile"}) {
      const auto fn = [&](const std::vector<Tensor>& a) { return sharded.hidden_states(a[0], a[1], layers); };
      std::vector<Tensor> got;
      if (mode == "compile") {
        CompileOptions o;
        o.fullgraph = true;
        got = CompiledFunction("text_encoder", fn, o)({id_t, mask_t}, sharded.parameters());
      } else {
        EagerModeGuard guard(mode == "defer" ? EagerMode::DeferAndFuse : EagerMode::DeferNever);
        got = fn({id_t, mask_t});
      }
      for (size_t k = 0; k < layers.size(); ++k) {
        const std::vector<float> g = to_vector(got[k]), w = to_vector(want[k]);
        double worst = 0;
        for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::fabs(double(g[i]) - double(w[i])));
        EXPECT_LE(worst, 1e-4) << single.config().model_type << " " << mode << " hidden_states." << layers[k];
        std::printf("%s %s hidden_states.%lld: max abs difference %.3g\n", single.config().model_type.c_str(),
                    mode.c_str(), (long long)layers[k], worst);
      }
    }
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace kiln
