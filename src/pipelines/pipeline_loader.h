// Loading a Diffusers pipeline folder for a concrete pipeline: model_index.json's components
// checked against the classes the pipeline implements (before anything is loaded), each
// component's folder, its torch_dtype, and each model built while its weights are collected
// and audited (unread checkpoint tensors: a warning, an error with --strict).
#pragma once
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/json_config.h"
#include "nn/component_load.h"
#include "nn/weight_source.h"
#include "pipelines/pipeline_state.h"

namespace kiln {

class PipelineLoader {
 public:
  // The classes model_index.json may name for a component: another class under a known folder
  // name (AutoencoderTiny as vae, say) is refused, not loaded as this one. An optional
  // component may be listed as [null, null] or left out.
  struct ComponentClasses {
    std::string component;
    std::vector<std::string> classes;
    bool optional = false;
  };
  // `model_components`: the components with weights, in model_cpu_offload_seq order.
  PipelineLoader(const std::filesystem::path& model, const PipelineOptions& options, const std::string& pipeline_class,
                 std::vector<ComponentClasses> classes, std::vector<std::string> model_components);

  const std::filesystem::path& dir() const { return state_->dir; }
  const PipelineOptions& options() const { return state_->options; }
  // The component is listed with a class (not [null, null] and not left out).
  bool has(const std::string& component) const;
  // Its folder, checked to exist (errors name model_index.json).
  std::filesystem::path path(const std::string& component) const;
  // torch_dtype of a model component: its own choice, else the pipeline's (std::nullopt: "auto").
  std::optional<DType> dtype(const std::string& component) const;
  // The storage type its linear weights are quantized into at load (--quantize), if any.
  std::optional<DType> quantization(const std::string& component) const;
  // The checkpoint file replacing its folder's weights (--transformer FILE, ...), opened; null
  // when none was given.
  std::shared_ptr<const nn::WeightSource> replacement(const std::string& component) const;

  // Builds a model component with `build()` while collecting the weights it loads; then checks
  // that it read every tensor of its checkpoint but those it skips on purpose (`not_loaded`).
  template <typename F>
  auto load(const std::string& component, const std::vector<std::string>& not_loaded, F&& build) {
    PipelineComponent& c = slot(component);
    std::optional<decltype(build())> model;
    const auto t0 = std::chrono::steady_clock::now();
    progress(component, -1);
    {
      WeightCollector collect(c.weights);
      nn::CheckpointAudit audit;
      nn::ComponentLoad weights(replacement(component), quantization(component));
      model.emplace(build());
      report_unused(c, audit.unused(not_loaded));
    }
    c.dtype = model->dtype();
    c.dir = path(component);
    progress(component, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    return std::move(*model);
  }

  // load() of a model whose from_pretrained takes its folder and dtype (a VAE, T5).
  template <typename Model>
  Model load_model(const std::string& component) {
    return load(component, Model::checkpoint_keys_not_loaded(),
                [&] { return Model::from_pretrained(path(component), dtype(component)); });
  }
  // load() of a diffusion transformer: under tensor parallelism this rank reads only its shard.
  template <typename Model>
  Model load_transformer(const std::string& component = "transformer") {
    return load(component, Model::checkpoint_keys_not_loaded(), [&] {
      const auto& tp = options().tensor_parallel;
      return tp ? Model::from_pretrained(path(component), *tp, dtype(component))
                : Model::from_pretrained(path(component), dtype(component));
    });
  }

  // The state the pipeline keeps; components not loaded (optional and absent) are dropped.
  std::unique_ptr<PipelineState> finish();

 private:
  PipelineComponent& slot(const std::string& component);
  void report_unused(const PipelineComponent& c, const std::vector<std::string>& unused) const;
  // The options' on_progress for the load of `component` (seconds < 0: it starts).
  void progress(const std::string& component, double seconds) const;

  std::chrono::steady_clock::time_point t0_;
  std::unique_ptr<PipelineState> state_;  // before index_: its dir names the index file
  io::JsonConfig index_;
  std::vector<std::string> loaded_;
};

}  // namespace kiln
