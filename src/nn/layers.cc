#include "nn/layers.h"

namespace kiln::nn {

Linear::Linear(const Weights& w, int64_t in_features, int64_t out_features, bool has_bias)
    : weight(w.get("weight", {out_features, in_features})),
      bias(has_bias ? w.get("bias", {out_features}) : Tensor()) {}

LayerNorm::LayerNorm(const Weights& w, int64_t dim, double eps_, bool affine, bool has_bias)
    : weight(affine ? w.get("weight", {dim}) : Tensor()),
      bias(affine && has_bias ? w.get("bias", {dim}) : Tensor()),
      eps(eps_) {}

RMSNorm::RMSNorm(const Weights& w, int64_t dim, double eps_, bool affine)
    : weight(affine ? w.get("weight", {dim}) : Tensor()), eps(eps_) {}

GroupNorm::GroupNorm(const Weights& w, int64_t groups_, int64_t channels, double eps_, bool affine)
    : weight(affine ? w.get("weight", {channels}) : Tensor()),
      bias(affine ? w.get("bias", {channels}) : Tensor()),
      groups(groups_),
      eps(eps_) {}

Conv2d::Conv2d(const Weights& w, int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride_,
               int64_t padding_, bool has_bias)
    : weight(w.get("weight", {out_channels, in_channels, kernel, kernel})),
      bias(has_bias ? w.get("bias", {out_channels}) : Tensor()),
      stride(stride_),
      padding(padding_) {}

Embedding::Embedding(const Weights& w, int64_t num, int64_t dim) : weight(w.get("weight", {num, dim})) {}

namespace {
void append_defined(std::vector<Tensor>& out, std::initializer_list<Tensor> ts) {
  for (const Tensor& t : ts)
    if (t.defined()) out.push_back(t);
}
}  // namespace

void Linear::append_parameters(std::vector<Tensor>& out) const { append_defined(out, {weight, bias}); }
void LayerNorm::append_parameters(std::vector<Tensor>& out) const { append_defined(out, {weight, bias}); }
void RMSNorm::append_parameters(std::vector<Tensor>& out) const { append_defined(out, {weight}); }

}  // namespace kiln::nn
