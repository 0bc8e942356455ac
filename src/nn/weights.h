// Weights: a module's view of a checkpoint (any WeightSource; normally a safetensors file,
// index or folder) under a key prefix, so a model builds itself with the same names as the Diffusers/transformers
// state dict ("transformer_blocks.0.attn.to_q.weight"). Every tensor is checked against
// the shape the config implies; errors name the checkpoint, the full key and both shapes.
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/thread_scope.h"
#include "distributed/tensor_parallel.h"
#include "nn/weight_source.h"

namespace kiln::nn {

class Weights {
 public:
  Weights() = default;
  // A file, index or folder (or what the active ComponentLoad replaces it with, with its
  // quantization: nn/component_load.h).
  explicit Weights(const std::filesystem::path& checkpoint);
  explicit Weights(std::shared_ptr<const WeightSource> source, std::string prefix = "");

  // The weights of a child module: prefix + name + ".".
  Weights sub(const std::string& name) const;
  Weights sub(const std::string& name, int64_t index) const { return sub(name + "." + std::to_string(index)); }

  bool has(const std::string& name) const;
  Shape stored_shape(const std::string& name) const;  // as the checkpoint stores it (must exist)
  // The tensor `name` in this module's dtype (dtype()), or in `dtype`: read in place (zero-copy)
  // when it is stored in that dtype, else converted once, here; throws naming the key when
  // missing or when its shape is not `shape`.
  Tensor get(const std::string& name, const Shape& shape) const { return get(name, shape, dtype_); }
  Tensor get(const std::string& name, const Shape& shape, DType dtype) const;
  // The dtype float weights are held and computed in (Diffusers' torch_dtype; children inherit
  // it). f32 unless the loader chose another (PipelineOptions::dtype).
  DType dtype() const { return dtype_; }
  // std::nullopt is torch_dtype "auto": the dtype the checkpoint stores most of its weight bytes
  // in (nn::stored_float_dtype).
  Weights with_dtype(std::optional<DType> dtype) const;
  std::string key(const std::string& name) const { return prefix_ + name; }
  std::string describe() const { return source_ ? source_->describe() : "(no checkpoint)"; }
  // This module's path: the prefix without its trailing '.' ("transformer_blocks.3.attn.to_q").
  std::string path() const { return prefix_.empty() ? prefix_ : prefix_.substr(0, prefix_.size() - 1); }

  // Quantized linear weights (core/quant_blocks.h). A weight the checkpoint stores in a storage
  // type (fp8, GGUF blocks) is held as stored; with a quantization set (--quantize; children
  // inherit it), float linear weights whose in_features are a whole number of its blocks are
  // quantized into it once, here at load. Other tensors (norms, embeddings, biases) are never
  // quantized; stored quantized ones are dequantized once into dtype() by get().
  Weights with_quantization(std::optional<DType> type) const;
  std::optional<DType> quantization() const { return quantize_; }
  // The linear weight `name` [N,K] as above (held quantized or in dtype()). Quantizing into fp8
  // sets *scale (when given) to the per-tensor scale the values were divided by
  // (nn/weight_quantization.h); without `scale` fp8 stores the values unscaled.
  Tensor get_linear_weight(const std::string& name, const Shape& shape, Tensor* scale = nullptr) const;
  // Rows/columns of it (get_slice), as stored or in dtype() (never quantized here: tensor
  // parallelism with quantization at load is refused).
  Tensor get_linear_weight_slice(const std::string& name, const Shape& shape, int dim, int64_t start, int64_t length,
                                 bool collect = true) const;

  // Tensor parallelism: the plan the model is loaded under (children inherit it; null: every
  // tensor whole). Layers look their own path up in it.
  Weights with_plan(std::shared_ptr<const ShardPlan> plan) const;
  const ShardPlan* plan() const { return plan_.get(); }
  // Rows (dim 0) or columns (dim 1) [start, start+length) of `name`, whose full shape must be
  // `shape`; only the slice's bytes are read from a checkpoint.
  // `collect`: whether model offload learns the slice as one of the component's weights (false
  // for pieces a layer joins into one weight, which it then reports with collect_weight).
  Tensor get_slice(const std::string& name, const Shape& shape, int dim, int64_t start, int64_t length,
                   bool collect = true) const;
  // Reports a weight a layer built itself (joined shards), under its state-dict key, to model
  // offload (exec/residency.h) and to the active ParameterRecorders.
  static void collect_weight(const std::string& key, const Tensor& weight);

 private:
  // key(name), after checking the tensor exists with `shape` (errors name the checkpoint and key).
  std::string checked_key(const std::string& name, const Shape& shape, WeightUse use = WeightUse::other) const;
  // The dtype a linear weight is loaded in: its stored storage type, else dtype().
  DType linear_load_dtype(const std::string& key) const;

  std::shared_ptr<const WeightSource> source_;
  std::string prefix_;
  std::shared_ptr<const ShardPlan> plan_;
  DType dtype_ = DType::f32;
  std::optional<DType> quantize_;
};

// A module's parameters by their state-dict keys, sorted by key: what its compiled form takes as
// runtime arguments, what TP plans and offload name. Blocks of the same
// structure have the same relative keys, so their lists line up.
using NamedParameters = std::vector<std::pair<std::string, Tensor>>;
std::vector<Tensor> parameter_values(const NamedParameters& named);

// While alive, every weight this thread loads through Weights (get, get_slice, collect_weight)
// is recorded with its key; recorders nest, and each records everything loaded in its lifetime.
// A module builds itself inside one, so its parameter list is derived from the names it read,
// never kept by hand.
class ParameterRecorder : public ThreadScope<ParameterRecorder> {
 public:
  static void record(const std::string& key, const Tensor& t);
  // What was recorded, with `prefix` + "." taken off the keys ("transformer_blocks.3" makes
  // "transformer_blocks.3.attn.to_q.weight" "attn.to_q.weight"), sorted, each key once.
  NamedParameters named(const std::string& prefix = "") const;

 private:
  std::vector<std::pair<std::string, Tensor>> recorded_;
};

}  // namespace kiln::nn
