#include "nn/layers.h"

#include <cstring>

#include "core/error.h"
#include "exec/host.h"
#include "nn/shapes_only_load.h"

namespace kiln::nn {

namespace {

// 2-D (or 1-D) host tensors joined along `dim` into one host tensor (packed shards).
Tensor join_host(const std::vector<Tensor>& parts, int dim) {
  if (parts.size() == 1) return parts[0];
  if (ShapesOnlyLoad::active()) {
    Shape joined = parts[0].shape();
    for (size_t i = 1; i < parts.size(); ++i) joined[size_t(dim)] += parts[i].dim(dim);
    return ShapesOnlyLoad::weight(joined, parts[0].dtype());
  }
  const bool vec = parts[0].rank() == 1;
  const int64_t rows_each = vec ? 1 : parts[0].dim(0);
  int64_t rows = 0, cols = 0;
  for (const Tensor& p : parts) {
    wait(p);
    if (dim == 0) rows += vec ? p.dim(0) : p.dim(0);
    else cols += p.dim(1);
  }
  if (dim == 0) cols = vec ? 1 : parts[0].dim(1);
  else rows = rows_each;
  const DType dt = parts[0].dtype();
  BufferPtr buf = host_allocate(storage_bytes(dt, rows * cols));
  char* dst = static_cast<char*>(buf->data());
  if (dim == 0) {
    for (const Tensor& p : parts) {
      std::memcpy(dst, p.data_ptr(), p.nbytes());
      dst += p.nbytes();
    }
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (const Tensor& p : parts) {
        const size_t run = storage_bytes(dt, p.dim(1));  // whole blocks: TP checks the column split
        std::memcpy(dst, static_cast<const char*>(p.data_ptr()) + size_t(r) * run, run);
        dst += run;
      }
  }
  return Tensor::view_of(std::move(buf), vec ? Shape{rows} : Shape{rows, cols}, parts[0].dtype());
}

}  // namespace

Linear::Linear(const Weights& w, int64_t in_features, int64_t out_features, bool has_bias) {
  const TensorParallelEntry* e = w.plan() ? w.plan()->find(w.path()) : nullptr;
  const int ws = e ? w.plan()->group->size() : 1, rank = e ? w.plan()->group->rank() : 0;
  dtype = w.dtype();
  // "Scaled fp8" checkpoints store W / s in fp8 with the scale s beside it (ComfyUI names it
  // scale_weight, others weight_scale), one per tensor ([] or [1]) or per output feature ([N] or
  // [N,1]): y = (x · Wᵀ) · s + b.
  for (const char* name : {"scale_weight", "weight_scale"}) {
    if (!w.has(name)) continue;
    const Shape stored = w.stored_shape(name);
    const int64_t n = kiln::numel(stored);
    KILN_CHECK(n == 1 || n == out_features, "weights", w.describe(), ": '", w.key(name), "' has shape ",
               to_string(stored), "; a weight scale is one value or one per output feature (", out_features, ")");
    weight_scale = reshape(w.get(name, stored), n == 1 ? Shape{} : Shape{out_features});
  }
  // Activations stay unquantized: an input scale is read (so it is not reported unused), not applied.
  if (w.has("input_scale")) (void)w.get("input_scale", w.stored_shape("input_scale"));
  if (e == nullptr || ws == 1) {
    weight = w.get_linear_weight("weight", {out_features, in_features}, weight_scale.defined() ? nullptr : &weight_scale);
    bias = has_bias ? w.get("bias", {out_features}) : Tensor();
    return;
  }
  KILN_CHECK(!weight_scale.defined() || weight_scale.numel() == 1, "tp", w.path(),
             ": a per-feature weight scale (scaled fp8) is not sharded; use a checkpoint with one scale per tensor");
  const bool by_rows = e->style == "colwise" || e->style == "packed_colwise" || e->style == "colwise_gather";
  parallel = e->style == "colwise_gather" ? Parallel::colwise_gather : by_rows ? Parallel::colwise : Parallel::rowwise;
  world_size = ws;
  const int64_t size = by_rows ? out_features : in_features;
  const std::vector<int64_t> blocks = e->blocks.empty() ? std::vector<int64_t>{1} : e->blocks;
  int64_t total = 0;
  for (int64_t b : blocks) total += b;
  const char* what = by_rows ? "out_features" : "in_features";
  KILN_CHECK(size % total == 0, "tp", w.path(), ": ", e->style, " needs ", what, " (", size,
             ") to split into blocks ", to_string(Shape(blocks)));
  std::vector<Tensor> w_parts, b_parts;
  int64_t offset = 0;
  for (int64_t b : blocks) {
    const int64_t block = size / total * b;
    KILN_CHECK(block % ws == 0, "tp", w.path(), ": ", e->style, " splits ", what, " ",
               blocks.size() > 1 ? "block " : "", block, " across ", ws, " ranks, which does not divide it");
    const int64_t piece = block / ws, start = offset + rank * piece;
    // Pieces of a packed weight are joined into one: that one is the weight offload moves.
    const bool one_piece = blocks.size() == 1;
    w_parts.push_back(
        w.get_linear_weight_slice("weight", {out_features, in_features}, by_rows ? 0 : 1, start, piece, one_piece));
    if (has_bias && by_rows)
      b_parts.push_back(w.get_slice("bias", {out_features}, 0, start, piece, one_piece));
    offset += block;
  }
  weight = join_host(w_parts, by_rows ? 0 : 1);
  if (has_bias) bias = by_rows ? join_host(b_parts, 0) : w.get("bias", {out_features});  // rowwise: added once, whole
  if (blocks.size() > 1) {
    Weights::collect_weight(w.key("weight"), weight);
    if (by_rows && has_bias) Weights::collect_weight(w.key("bias"), bias);
  }
}

Tensor Linear::operator()(const Tensor& x) const {
  // With a weight scale the bias is added after scaling the product.
  const auto product = [&](const Tensor& b) {
    if (!weight_scale.defined()) return linear(x, weight, b);
    const Tensor y = linear(x, weight) * weight_scale;
    return b.defined() ? y + b : y;
  };
  switch (parallel) {
    case Parallel::none:
    case Parallel::colwise: return product(bias);
    case Parallel::rowwise: {
      const Tensor y = all_reduce(product(Tensor()));
      return bias.defined() ? y + bias : y;
    }
    case Parallel::colwise_gather: return all_gather(product(bias), x.rank() - 1, world_size);
  }
  return Tensor();
}

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

Embedding::Embedding(const Weights& w, int64_t num, int64_t dim) {
  const TensorParallelEntry* e = w.plan() ? w.plan()->find(w.path()) : nullptr;
  const int ws = e ? w.plan()->group->size() : 1, rank = e ? w.plan()->group->rank() : 0;
  if (e == nullptr || ws == 1) {
    weight = w.get("weight", {num, dim});
    return;
  }
  KILN_CHECK(e->style == "vocab_parallel", "tp", w.path(), ": an Embedding is sharded only as vocab_parallel, not ",
             e->style);
  KILN_CHECK(num % ws == 0, "tp", w.path(), ": vocab_parallel splits ", num, " rows across ", ws,
             " ranks, which does not divide them");
  const int64_t rows = num / ws;
  vocab_start = rank * rows;
  vocab_parallel = true;
  weight = w.get_slice("weight", {num, dim}, 0, vocab_start, rows);
}

Tensor Embedding::operator()(const Tensor& ids) const {
  if (!vocab_parallel) return gather(weight, ids);
  // Row arithmetic in f32 is exact for any vocabulary below 2^24 ids.
  const Tensor local = cast(ids, DType::f32) - double(vocab_start);
  const Tensor row = clamp(local, 0.0, double(weight.dim(0) - 1));
  const Tensor mine = unsqueeze(eq(local, row), -1);  // the id is one of this rank's rows
  const Tensor looked_up = gather(weight, cast(row, DType::i64));
  return all_reduce(where(mine, looked_up, zeros({1}, weight.dtype())));
}

namespace {
void append_defined(std::vector<Tensor>& out, std::initializer_list<Tensor> ts) {
  for (const Tensor& t : ts)
    if (t.defined()) out.push_back(t);
}
}  // namespace

void Linear::append_parameters(std::vector<Tensor>& out) const { append_defined(out, {weight, bias, weight_scale}); }
void LayerNorm::append_parameters(std::vector<Tensor>& out) const { append_defined(out, {weight, bias}); }
void RMSNorm::append_parameters(std::vector<Tensor>& out) const { append_defined(out, {weight}); }

}  // namespace kiln::nn
