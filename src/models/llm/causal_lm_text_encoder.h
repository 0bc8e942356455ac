// The language model of FLUX.2's text encoders, used for its hidden states:
// FLUX.2-dev's Mistral3ForConditionalGeneration (its Mistral language model; the vision tower,
// projector and lm_head are never read) and FLUX.2 [klein]'s Qwen3ForCausalLM, one decoder-only
// class: token embedding, decoder layers (RMSNorm, grouped-query self-attention with half-split
// RoPE and a causal + key-padding mask, SwiGLU MLP; Qwen3 adds a per-head RMSNorm on q and k
// before RoPE), final RMSNorm. Weights use the transformers state-dict names under any of the
// language model's key prefixes (`model.language_model.`, the legacy `language_model.model.`,
// Qwen3's `model.`); computes in the dtype it is loaded in, rounding where transformers does.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/tensor_parallel.h"
#include "models/llm/decoder_lm_config.h"
#include "nn/layers.h"

namespace kiln {

class CausalLMTextEncoder {
 public:
  // transformers' tensor-parallel plan for these LLMs, relative to the language model
  // ("layers.*.self_attn.q_proj"): q/k/v and gate/up colwise (whole heads, and the SwiGLU
  // halves), o_proj and down_proj rowwise (one all-reduce each); the norms (q_norm/k_norm act
  // per head, so they stay whole) are replicated. Beyond transformers' plan the token table is
  // vocab_parallel (rows split, lookups summed exactly), so a rank holds ~half of what it reads.
  // from_pretrained puts the checkpoint's key prefix in front.
  static std::vector<TensorParallelEntry> tp_plan();

  // The decoder layers hidden_states(..., layers) runs: the largest index (index k is the output
  // of layer k-1). What to pass from_pretrained as num_layers_needed for a pipeline's
  // text_encoder_out_layers.
  static int64_t num_layers_needed(const std::vector<int64_t>& layers);

  // Checkpoint key prefixes a model loaded with num_layers_needed leaves unread on purpose: the
  // lm_head, a Mistral3 checkpoint's vision tower and projector, the layers from
  // num_layers_needed on, and the final norm unless every layer is loaded. Every key-prefix form
  // of the model type is listed (the pipeline loader builds the list before the model exists).
  static std::vector<std::string> checkpoint_keys_not_loaded(const DecoderLMConfig& config,
                                                             int64_t num_layers_needed = -1);
  // The same for the text encoder folder `dir` (reads its config.json).
  static std::vector<std::string> checkpoint_keys_not_loaded(const std::filesystem::path& dir,
                                                             int64_t num_layers_needed = -1);
  // The same for this model (its config and the layers it loaded).
  std::vector<std::string> checkpoint_keys_not_loaded() const;

  // `dir` holds config.json and model.safetensors (or model.safetensors.index.json + shards).
  // Loads the embedding table and decoder layers 0..num_layers_needed-1 only (-1: all), and the
  // final norm only when every layer is. `dtype`: torch_dtype (std::nullopt: "auto", the
  // checkpoint's). With `tp`, each rank reads only its slices of the planned linears and
  // attends over its own heads; errors before any load when the mesh size does not divide the
  // attention heads and the KV heads.
  static CausalLMTextEncoder from_pretrained(const std::filesystem::path& dir, std::optional<DType> dtype = DType::f32,
                                             int64_t num_layers_needed = -1,
                                             std::optional<TensorParallelConfig> tp = std::nullopt);
  // From an explicit config and checkpoint (at the state-dict root; a plan in `weights` must name
  // full paths, key prefix included).
  CausalLMTextEncoder(DecoderLMConfig config, const nn::Weights& weights, int64_t num_layers_needed = -1);

  // transformers' output_hidden_states entries at `layers` (in that order): index 0 is the token
  // embeddings, k the output of decoder layer k-1, and num_hidden_layers the final-norm output
  // (the last entry is replaced by the normed state: a transformers QUIRK). Runs only the layers
  // the largest index needs. input_ids [B, L] integer; attention_mask [B, L] integer (or bool),
  // nonzero = a real token, padding on either side. Positions are 0..L-1 whatever the mask;
  // every position, padding included, gets its state (a padding query that sees no real key,
  // as on the left, gets a zero attention output). [B, L, hidden_size] each, in dtype().
  // Reads no value on the host (it can be traced and compiled).
  std::vector<Tensor> hidden_states(const Tensor& input_ids, const Tensor& attention_mask,
                                    const std::vector<int64_t>& layers) const;

  const DecoderLMConfig& config() const { return config_; }
  DType dtype() const { return embed_tokens_.weight.dtype(); }  // torch_dtype it was loaded in
  // The language model's key prefix in the checkpoint ("model.language_model.", ...).
  const std::string& key_prefix() const { return prefix_; }
  int64_t num_layers_loaded() const { return int64_t(layers_.size()); }
  bool has_final_norm() const { return norm_.weight.defined(); }
  // Every weight it loaded under its checkpoint key (a rank's slices under their key).
  const nn::NamedParameters& named_parameters() const { return named_parameters_; }
  std::vector<Tensor> parameters() const { return nn::parameter_values(named_parameters_); }

  // cos and sin [L, head_dim] of positions 0..L-1 (fp32 math, as transformers' default RoPE),
  // cast to `dtype`.
  static std::pair<Tensor, Tensor> rotary_tables(int64_t length, int64_t head_dim, double theta, DType dtype);

 private:
  struct Layer {
    nn::RMSNorm input_layernorm, post_attention_layernorm, q_norm, k_norm;
    nn::Linear q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  };
  Tensor rms_norm(const nn::RMSNorm& norm, const Tensor& x) const;
  Tensor attention(const Layer& layer, const Tensor& x, const Tensor& cos, const Tensor& sin,
                   const Tensor& mask) const;
  Tensor additive_mask(const Tensor& attention_mask, int64_t length) const;

  DecoderLMConfig config_;
  std::string prefix_;
  nn::Embedding embed_tokens_;
  std::vector<Layer> layers_;
  nn::RMSNorm norm_;  // empty unless every layer is loaded
  nn::NamedParameters named_parameters_;
};

}  // namespace kiln
