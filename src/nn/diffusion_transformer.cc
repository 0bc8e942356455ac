#include "nn/diffusion_transformer.h"

#include "core/error.h"
#include "exec/capture.h"
#include "exec/memory_plan.h"

namespace kiln::nn {

void DiffusionTransformer::compile(const CompileOptions& options) {
  options.validate(class_name());
  auto c = std::make_shared<Compiled>();
  c->options = options;
  compiled_ = std::move(c);
  compiled_variant("", {});
}

void DiffusionTransformer::compile_repeated_blocks(const CompileOptions& options) {
  std::vector<CompilableBlock*> blocks;
  for_each_block([&](CompilableBlock& b) { blocks.push_back(&b); });
  nn::compile_repeated_blocks(class_name(), repeated_block_classes(), blocks, options);
}

bool DiffusionTransformer::any_compiled() const {
  bool any = is_compiled();
  for_each_block([&](const CompilableBlock& b) { any = any || b.is_compiled(); });
  return any;
}

const CompiledFunction& DiffusionTransformer::compiled_variant(const std::string& variant,
                                                               const std::function<Traced()>& make) const {
  KILN_CHECK(compiled_, class_name(), "is not compiled");
  std::lock_guard<std::mutex> lock(compiled_->mu);
  std::shared_ptr<const CompiledFunction>& f = compiled_->by_variant[variant];
  if (!f)
    f = std::make_shared<const CompiledFunction>(variant.empty() ? std::string(class_name())
                                                                 : std::string(class_name()) + " " + variant,
                                                 variant.empty() ? traced() : make(), compiled_->options, arg_names());
  return *f;
}

std::vector<Tensor> DiffusionTransformer::run_compiled(const std::vector<Tensor>& args, const std::string& variant,
                                                       const std::function<Traced()>& make) const {
  return compiled_variant(variant, make)(args, parameters());
}

void DiffusionTransformer::warmup_with(const std::vector<Tensor>& placeholder_args) const {
  if (compiled_) {
    compiled_variant("", {}).prepare(placeholder_args, parameters());
    return;
  }
  if (!any_compiled()) return;  // nothing to prepare
  // The compiled blocks a forward calls, with the args they are called with: read off one trace.
  CompiledCallsMet met;
  const Traced forward = traced();
  detail::capture(class_name(), [&] { return forward(placeholder_args); });
  for (const CompiledCallsMet::Call& call : met.calls()) call.function->prepare(call.args, call.params);
}

size_t DiffusionTransformer::activation_bytes_with(const std::vector<Tensor>& placeholder_args) const {
  const Traced forward = traced();
  const detail::Captured cap = detail::capture(class_name(), [&] { return forward(placeholder_args); });
  return unfused_peak_bytes_on(cap.recorded, default_device());
}

void DiffusionTransformer::for_each_block(const std::function<void(const CompilableBlock&)>& f) const {
  // One visitor per model; `f` only reads what it is given.
  const_cast<DiffusionTransformer*>(this)->for_each_block([&](CompilableBlock& b) { f(b); });
}

void check_positive(int64_t v, const char* field, const char* where, const std::string& source) {
  KILN_CHECK(v > 0, where, source, ": '", field, "' must be positive, got ", v);
}

int64_t DiffusionTransformer::check_image_tokens(const Tensor& hidden_states, int64_t in_channels) const {
  KILN_CHECK(hidden_states.rank() == 3 && hidden_states.dim(2) == in_channels, class_name(),
             "hidden_states must be [B, L_img, ", in_channels, "], got ", to_string(hidden_states.shape()));
  return hidden_states.dim(0);
}

void DiffusionTransformer::check_text_states(const Tensor& encoder_hidden_states, int64_t batch,
                                             int64_t joint_attention_dim) const {
  const Tensor& e = encoder_hidden_states;
  KILN_CHECK(e.rank() == 3 && e.dim(0) == batch && e.dim(2) == joint_attention_dim, class_name(),
             "encoder_hidden_states must be [", batch, ", L_txt, ", joint_attention_dim, "], got ",
             to_string(e.shape()));
}

void DiffusionTransformer::check_pooled(const Tensor& pooled_projections, int64_t batch, int64_t dim) const {
  KILN_CHECK(pooled_projections.shape() == Shape({batch, dim}), class_name(), "pooled_projections must be [", batch,
             ", ", dim, "], got ", to_string(pooled_projections.shape()));
}

void DiffusionTransformer::check_per_sample(const Tensor& t, int64_t batch, const char* name) const {
  KILN_CHECK(t.rank() == 1 && (t.dim(0) == batch || t.dim(0) == 1), class_name(), name, " must be [", batch,
             "], got ", to_string(t.shape()));
}

void DiffusionTransformer::check_heads_divide(const TensorParallelConfig& tp, int64_t heads,
                                              const std::filesystem::path& config) {
  const int n = tp.mesh.size();
  KILN_CHECK(heads % n == 0, "tp", "tp_degree (", n, ") must divide the number of attention heads (", heads, ") of ",
             config.string());
}

void DiffusionTransformer::refuse_extra(const Weights& w, const std::string& key, const std::string& what) const {
  KILN_CHECK(!w.has(key), class_name(), w.describe(), ": the checkpoint has '", w.key(key), "' but ", what);
}

void DiffusionTransformer::refuse_more_blocks(const Weights& w, const std::string& stack, int64_t count,
                                              const std::string& tensor, const char* field) const {
  refuse_extra(w, stack + "." + std::to_string(count) + "." + tensor,
               std::string("the config has ") + field + "=" + std::to_string(count));
}

}  // namespace kiln::nn
