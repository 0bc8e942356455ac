// SD3Transformer2DModel: the Stable Diffusion 3 / 3.5 diffusion transformer (MMDiT, and
// SD3.5 Medium's MMDiT-X with dual-attention layers and QK RMSNorm), as in Diffusers.
// Loaded from a Diffusers "transformer" folder (config.json + safetensors) with the
// Diffusers state-dict names; computes in the dtype it is loaded in (f32 by default).
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "distributed/tensor_parallel.h"
#include "io/json_config.h"
#include "nn/pretrained_transformer.h"
#include "models/sd3/sd3_blocks.h"
#include "models/sd3/sd3_embeddings.h"
#include "nn/embeddings.h"

namespace kiln {

// transformer/config.json with the class defaults.
struct SD3TransformerConfig {
  int64_t sample_size = 128;  // only defines Diffusers' formula for the table; the table is loaded
  int64_t patch_size = 2;
  int64_t in_channels = 16;
  int64_t num_layers = 18;
  int64_t attention_head_dim = 64;
  int64_t num_attention_heads = 18;
  int64_t joint_attention_dim = 4096;
  int64_t caption_projection_dim = 1152;
  int64_t pooled_projection_dim = 2048;
  int64_t out_channels = 16;  // config null -> in_channels
  int64_t pos_embed_max_size = 96;
  std::vector<int64_t> dual_attention_layers;  // MMDiT-X blocks (absent -> none)
  std::optional<std::string> qk_norm;          // null/absent -> none; "rms_norm"

  static SD3TransformerConfig from_json(const io::JsonConfig& json);  // reads and validates
  // Errors (naming `source` and the field) when a value is unsupported or inconsistent.
  void validate(const std::string& source = "SD3TransformerConfig") const;

  int64_t inner_dim() const { return num_attention_heads * attention_head_dim; }
  int64_t out_features() const { return patch_size * patch_size * out_channels; }
  int64_t mlp_hidden() const { return 4 * inner_dim(); }
  // The structure of block i (dual attention, context_pre_only = the last block, qk_norm).
  sd3::JointBlockStructure block_structure(int64_t i) const;
};

class SD3Transformer2DModel
    : public nn::PretrainedTransformer<SD3Transformer2DModel, SD3TransformerConfig, sd3::JointTransformerBlock> {
 public:
  static constexpr const char* kClassName = "SD3Transformer2DModel";
  // A tensor-parallel plan in the style of FLUX's (Diffusers has none for SD3): heads
  // colwise for every Q/K/V projection, rowwise for the attention output projections, the
  // feed-forwards colwise then rowwise; everything else replicated. With shard_modulation the
  // AdaLN modulation linears are added as colwise_gather.
  static std::vector<TensorParallelEntry> tp_plan(const SD3TransformerConfig& config = {},
                                                  bool shard_modulation = false);

  // Builds from an explicit config and checkpoint (shapes checked against the config).
  SD3Transformer2DModel(SD3TransformerConfig config, const nn::Weights& weights);

  // hidden_states [B, in_ch, h, w] (h, w multiples of patch_size), encoder_hidden_states
  // [B, L_txt, joint_attention_dim], pooled_projections [B, pooled_dim], timestep [B] (or [1];
  // the scheduler's value as is, e.g. 1000.0) -> [B, out_ch, h, w]. Blocks listed in
  // skip_layers are skipped entirely (skip-layer guidance); each index must be a block.
  Tensor forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& pooled_projections,
                 const Tensor& timestep, const std::vector<int64_t>& skip_layers = {}) const;

  DType dtype() const { return core_.context_embedder.dtype; }  // torch_dtype it was loaded in

  // ---- compiled mode (nn::DiffusionTransformer) ----
  // Whole-model compile: one executable per input signature and skip_layers set (a different set
  // is a different graph, compiled on first use). Regional compile: blocks of the same structure
  // share one executable per shape (SD3.5 Medium: 3 — dual attention, plain, context_pre_only;
  // SD3.0 / 3.5 Large: 2).
  // Traces and compiles the executables a call with these shapes would use (no skip_layers),
  // without running anything: batch B, latent height × width, l_txt text tokens.
  void warmup(int64_t batch, int64_t height, int64_t width, int64_t l_txt) const {
    warmup_with(placeholder_args(batch, height, width, l_txt));
  }
  // Peak activation bytes of one forward at these sizes run op by op (the traced graph's
  // liveness, exec/memory_plan.h): model offload's fail-fast estimate. Runs nothing.
  size_t activation_bytes(int64_t batch, int64_t height, int64_t width, int64_t l_txt) const {
    return activation_bytes_with(placeholder_args(batch, height, width, l_txt));
  }

  // ---- sub-steps of forward (public so tests can compare them with Diffusers' modules) ----
  // PatchEmbed: latents [B, C, h, w] -> tokens with the cropped positional table added.
  Tensor pos_embed(const Tensor& hidden_states) const { return core_.pos_embed(hidden_states); }
  Tensor time_text_embed(const Tensor& timestep, const Tensor& pooled_projections) const {
    return core_.time_embedding(timestep, pooled_projections);
  }
  Tensor context_embedder(const Tensor& encoder_hidden_states) const {
    return core_.context_embedder(encoder_hidden_states);
  }
  const std::vector<sd3::JointTransformerBlock>& transformer_blocks() const { return core_.transformer_blocks; }
  Tensor norm_out(const Tensor& x, const Tensor& temb) const { return core_.norm_out(x, temb); }
  Tensor proj_out(const Tensor& x) const { return core_.proj_out(x); }
  // proj_out's tokens [B, (h/p)(w/p), p·p·out_ch] -> [B, out_ch, h, w].
  Tensor unpatchify(const Tensor& y, int64_t height, int64_t width) const { return core_.unpatchify(y, height, width); }

 private:
  // The modules, and forward past the input checks: what a whole-model compile traces (a copy
  // of it lives in the compiled callable; tensors are shared handles).
  struct Core {
    int64_t patch_size = 1, out_channels = 0;
    sd3::PatchEmbed pos_embed;
    nn::TimeTextEmbed time_text_embed;
    nn::Linear context_embedder, proj_out;
    std::vector<sd3::JointTransformerBlock> transformer_blocks;
    nn::AdaLayerNormContinuous norm_out;

    Tensor time_embedding(const Tensor& timestep, const Tensor& pooled_projections) const;
    Tensor unpatchify(const Tensor& y, int64_t height, int64_t width) const;
    // skip: sorted block indices to skip.
    Tensor forward(const Tensor& hidden_states, const Tensor& encoder_hidden_states, const Tensor& pooled_projections,
                   const Tensor& timestep, const std::vector<int64_t>& skip) const;
  };

  Traced traced() const override { return traced_skipping({}); }
  Traced traced_skipping(const std::vector<int64_t>& skip) const;
  std::vector<std::string> arg_names() const override;
  void for_each_block(const std::function<void(nn::CompilableBlock&)>& f) override;

  // Inputs with the right shapes and dtypes whose contents are never read (warmup, estimates):
  // hidden_states, encoder_hidden_states, pooled_projections, timestep.
  std::vector<Tensor> placeholder_args(int64_t batch, int64_t height, int64_t width, int64_t l_txt) const;
  // Sorted, deduplicated, each index checked to be a block.
  std::vector<int64_t> checked_skip_layers(const std::vector<int64_t>& skip_layers) const;

  Core core_;
};

}  // namespace kiln
