// DiffusionTransformer: what every diffusion transformer (FLUX.1's, SD3's, FLUX.2's) shares, as
// Diffusers' ModelMixin gives it to each: the load-time checks (the tensor-parallel head count,
// a checkpoint holding more than the config says), compile() and compile_repeated_blocks(),
// warm-up and the activation trace from one trace of the forward, and the named parameters.
// A model declares its repeated block classes, visits its blocks and gives its traced forward
// (the computation past the input checks and host-side tables, over the executable's args); its
// forward checks the inputs and calls run().
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/tensor_parallel.h"
#include "exec/compile.h"
#include "io/config_fields.h"
#include "io/json_config.h"
#include "nn/repeated_block.h"
#include "nn/weights.h"

namespace kiln::nn {

// The config.json fields every diffusion transformer's config has (Diffusers' names), read and
// checked once for all: `C` is the model's config struct, whose member defaults are its class's.
template <typename C>
void read_transformer_fields(const io::JsonConfig& j, C& c) {
  io::read_fields(j, {{"patch_size", c.patch_size}, {"in_channels", c.in_channels}, {"num_layers", c.num_layers},
                      {"attention_head_dim", c.attention_head_dim}, {"num_attention_heads", c.num_attention_heads},
                      {"joint_attention_dim", c.joint_attention_dim}});
}
// Errors naming `where`, `source` and the field when `v` is not positive.
void check_positive(int64_t v, const char* field, const char* where, const std::string& source);
template <typename C>
void check_transformer_fields(const C& c, const char* where, const std::string& source) {
  for (const auto& [v, field] : {std::pair{c.patch_size, "patch_size"}, {c.in_channels, "in_channels"},
                                 {c.attention_head_dim, "attention_head_dim"},
                                 {c.num_attention_heads, "num_attention_heads"},
                                 {c.joint_attention_dim, "joint_attention_dim"}})
    check_positive(v, field, where, source);
}

class DiffusionTransformer {
 public:
  virtual ~DiffusionTransformer() = default;

  // Whole-model compile (torch.compile(transformer, fullgraph, dynamic=False)): forward runs one
  // executable per input signature (and per variant, see run_compiled()).
  void compile(const CompileOptions& options = {});
  // Regional compile: every block whose class repeated_blocks() lists is compiled in place; the
  // rest of forward runs in the active eager mode. One executable per block class and shape.
  void compile_repeated_blocks(const CompileOptions& options = {});
  bool is_compiled() const { return compiled_ != nullptr; }
  // compile() or compile_repeated_blocks() was called.
  bool any_compiled() const;

  // Every tensor forward reads besides its inputs, by its Diffusers state-dict key (what TP
  // plans and offload name), and their values in key order (the executable's runtime arguments).
  const NamedParameters& named_parameters() const { return named_parameters_; }
  std::vector<Tensor> parameters() const { return parameter_values(named_parameters_); }

  // Diffusers' class name and _repeated_blocks.
  virtual const char* class_name() const = 0;
  virtual const std::vector<std::string>& repeated_block_classes() const = 0;

 protected:
  DiffusionTransformer() = default;
  DiffusionTransformer(const DiffusionTransformer&) = default;
  DiffusionTransformer(DiffusionTransformer&&) noexcept = default;
  DiffusionTransformer& operator=(const DiffusionTransformer&) = default;
  DiffusionTransformer& operator=(DiffusionTransformer&&) noexcept = default;

  using Traced = std::function<std::vector<Tensor>(const std::vector<Tensor>& args)>;
  // The forward over the executable's args, as a callable that owns what it reads (a copy of the
  // modules: tensors are shared handles), so an executable outlives moves of the model.
  virtual Traced traced() const = 0;
  // The executable's argument names, for errors and reports.
  virtual std::vector<std::string> arg_names() const = 0;
  // Calls `f` on every block, in forward order (and the same blocks read-only).
  virtual void for_each_block(const std::function<void(CompilableBlock&)>& f) = 0;
  void for_each_block(const std::function<void(const CompilableBlock&)>& f) const;

  // After compile(): the forward's result on `args` from its executable. `variant` names a static
  // choice that changes the graph (SD3's skipped layers) and `make` its traced forward; "" is
  // traced()'s.
  std::vector<Tensor> run_compiled(const std::vector<Tensor>& args, const std::string& variant = "",
                                   const std::function<Traced()>& make = {}) const;
  // Traces and compiles the executables a forward on arguments of these shapes would use (the
  // whole model's, or every compiled block's as met while tracing the forward), running nothing.
  void warmup_with(const std::vector<Tensor>& placeholder_args) const;
  // Peak activation bytes of one forward on arguments of these shapes run op by op (the traced
  // graph's liveness): model offload's fail-fast estimate. Runs nothing.
  size_t activation_bytes_with(const std::vector<Tensor>& placeholder_args) const;

  // ---- loading ----
  // from_pretrained of a Model whose Config has from_json and num_attention_heads: the folder's
  // config.json and checkpoint, in `dtype` (std::nullopt: the checkpoint's). With `tp` this rank
  // loads only its shard of every weight Model::tp_plan(config, shard_modulation) names, after
  // checking that the mesh divides the heads; nothing is read before that check.
  template <typename Model>
  static Model load_pretrained(const std::filesystem::path& dir, std::optional<DType> dtype,
                               const TensorParallelConfig* tp = nullptr) {
    auto config = std::remove_cvref_t<decltype(std::declval<const Model&>().config())>::from_json(
        io::JsonConfig(dir / "config.json"));
    Weights w = Weights(dir).with_dtype(dtype);
    if (tp) {
      check_heads_divide(*tp, config.num_attention_heads, dir / "config.json");
      w = w.with_plan(ShardPlan::make(Model::tp_plan(config, tp->shard_modulation), tp->mesh));
    }
    return Model(std::move(config), w);
  }

  // ---- load-time checks ----
  // Tensor parallelism shards attention by heads: the mesh must divide them.
  static void check_heads_divide(const TensorParallelConfig& tp, int64_t heads, const std::filesystem::path& config);
  // A checkpoint with more than the config says (another block, a guidance embedder) would load
  // "fine" and compute another model: an error naming the key and `what` the config says.
  void refuse_extra(const Weights& w, const std::string& key, const std::string& what) const;
  // refuse_extra for block `count` of `stack` ("transformer_blocks"), found by its `tensor`:
  // the config's `field` says there are only `count`.
  void refuse_more_blocks(const Weights& w, const std::string& stack, int64_t count, const std::string& tensor,
                          const char* field) const;
  void set_named_parameters(NamedParameters named) { named_parameters_ = std::move(named); }

  // ---- forward's input checks, errors naming the class ----
  // hidden_states as image tokens [B, L_img, in_channels]; returns B.
  int64_t check_image_tokens(const Tensor& hidden_states, int64_t in_channels) const;
  // encoder_hidden_states [batch, L_txt, joint_attention_dim].
  void check_text_states(const Tensor& encoder_hidden_states, int64_t batch, int64_t joint_attention_dim) const;
  // pooled_projections [batch, dim].
  void check_pooled(const Tensor& pooled_projections, int64_t batch, int64_t dim) const;
  // A per-sample scalar (timestep, guidance): [batch], or [1] for the whole batch.
  void check_per_sample(const Tensor& t, int64_t batch, const char* name) const;

 private:
  const CompiledFunction& compiled_variant(const std::string& variant, const std::function<Traced()>& make) const;

  struct Compiled {
    CompileOptions options;
    std::mutex mu;
    std::map<std::string, std::shared_ptr<const CompiledFunction>> by_variant;
  };
  std::shared_ptr<Compiled> compiled_;
  NamedParameters named_parameters_;
};

}  // namespace kiln::nn
