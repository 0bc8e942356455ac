// The layers models are built from. Each loads its parameters from Weights under the
// PyTorch names (weight, bias) and applies the op from exec/ops.h; none holds device details.
#pragma once
#include <optional>
#include <vector>

#include "exec/ops.h"
#include "nn/weights.h"

namespace kiln::nn {

// y = x W^T + b, W [out, in]. Under a tensor-parallel plan (Weights::plan) the
// layer loads only this rank's shard and computes its part: colwise keeps a slice of the output
// features; rowwise a slice of the input features, all-reduces the partial products, then adds
// the bias; colwise_gather all-gathers its output slices back to the whole output.
struct Linear {
  enum class Parallel { none, colwise, rowwise, colwise_gather };
  Linear() = default;
  Linear(const Weights& w, int64_t in_features, int64_t out_features, bool bias = true);
  Tensor operator()(const Tensor& x) const;
  // Appends the tensors the layer reads (weight, then bias and weight_scale if any): the
  // parameter list of compiled modules (exec/compile.h).
  void append_parameters(std::vector<Tensor>& out) const;
  // weight is held in dtype or in a quantized storage type (Weights::get_linear_weight);
  // weight_scale (scaled fp8 checkpoints) multiplies the product when defined.
  Tensor weight, bias, weight_scale;
  Parallel parallel = Parallel::none;
  int64_t world_size = 1;    // the ranks its plan shards it over
  DType dtype = DType::f32;  // the dtype the layer computes in (its Weights' dtype)
};

// LayerNorm over the last dim; `affine` = elementwise_affine (weight and bias).
struct LayerNorm {
  LayerNorm() = default;
  LayerNorm(const Weights& w, int64_t dim, double eps, bool affine = true, bool bias = true);
  Tensor operator()(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }
  void append_parameters(std::vector<Tensor>& out) const;
  Tensor weight, bias;
  double eps = 1e-5;
};

// RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * weight.
struct RMSNorm {
  RMSNorm() = default;
  RMSNorm(const Weights& w, int64_t dim, double eps, bool affine = true);
  Tensor operator()(const Tensor& x) const { return rms_norm(x, weight, eps); }
  void append_parameters(std::vector<Tensor>& out) const;
  Tensor weight;
  double eps = 1e-6;
};

struct GroupNorm {
  GroupNorm() = default;
  GroupNorm(const Weights& w, int64_t groups, int64_t channels, double eps, bool affine = true);
  Tensor operator()(const Tensor& x) const { return group_norm(x, groups, weight, bias, eps); }
  // silu(norm(x)) in one pass (the same values).
  Tensor then_silu(const Tensor& x) const { return group_norm(x, groups, weight, bias, eps, /*then_silu=*/true); }
  Tensor weight, bias;
  int64_t groups = 32;
  double eps = 1e-6;
};

// NCHW convolution with square kernel, stride and padding.
struct Conv2d {
  Conv2d() = default;
  Conv2d(const Weights& w, int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride = 1,
         int64_t padding = 0, bool bias = true);
  // With a residual: conv(x) + residual, added by the convolution itself where it can (ops.h).
  Tensor operator()(const Tensor& x, const Tensor& residual = Tensor()) const {
    return conv2d(x, weight, bias, {stride, stride}, {padding, padding}, residual);
  }
  Tensor weight, bias;
  int64_t stride = 1, padding = 0;
};

// Lookup table [num, dim]; ids of any integer shape -> ids.shape + [dim]. Under a plan entry
// "vocab_parallel" (kiln's own; transformers replicates the table) rank r holds rows
// [r·num/ws, (r+1)·num/ws): each rank looks up the ids in its rows, gives zeros for the others,
// and one all_reduce adds the ranks' results — exact, as only one term of each sum is nonzero.
struct Embedding {
  Embedding() = default;
  Embedding(const Weights& w, int64_t num, int64_t dim);
  Tensor operator()(const Tensor& ids) const;
  Tensor weight;
  int64_t vocab_start = 0;  // the first row this rank holds (vocab_parallel)
  bool vocab_parallel = false;
};

}  // namespace kiln::nn
