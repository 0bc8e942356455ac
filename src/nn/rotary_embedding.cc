#include "nn/rotary_embedding.h"

#include <cmath>

#include "core/error.h"
#include "exec/capture.h"
#include "exec/host.h"

namespace kiln::nn {

RotaryTables RotaryTables::of(Tensor cos, Tensor sin) {
  // A whole head row of (-1, 1) pairs rather than one pair, so kernels read it in long runs.
  const int64_t hd = cos.dim(-1);
  std::vector<float> pattern(static_cast<size_t>(hd));
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = i % 2 == 0 ? -1.0f : 1.0f;
  Tensor sign = from_vector(pattern, {hd / 2, 2}, DType::f32, cos.device());
  return RotaryTables{std::move(cos), std::move(sin), std::move(sign)};
}

std::vector<Tensor> RotaryTables::args(std::vector<Tensor> before) const {
  before.insert(before.end(), {cos, sin, pair_sign});
  return before;
}

std::vector<std::string> RotaryTables::arg_names(std::vector<std::string> before) {
  before.insert(before.end(), {"rope.cos", "rope.sin", "rope.pair_sign"});
  return before;
}

RotaryTables RotaryTables::from_args(const std::vector<Tensor>& args, size_t first) {
  return RotaryTables{args.at(first), args.at(first + 1), args.at(first + 2)};
}

RotaryTables flux_pos_embed(const Tensor& ids, const std::vector<int64_t>& axes_dim, double theta) {
  KILN_CHECK(ids.rank() == 2 && ids.dim(1) == int64_t(axes_dim.size()), "FluxPosEmbed", "expects ids [S, ",
             axes_dim.size(), "], got ", to_string(ids.shape()));
  int64_t hd = 0;
  for (int64_t d : axes_dim) {
    KILN_CHECK(d > 0 && d % 2 == 0, "FluxPosEmbed", "every axes_dims_rope entry must be even, got ", d);
    hd += d;
  }
  // Diffusers computes these tables in float64 and rounds them to f32; the op API has no f64,
  // so they are built on the host (S x head_dim values, negligible next to the blocks). This
  // reads the ids, which are pipeline inputs, so it waits only for them.
  const int64_t S = ids.dim(0), n_axes = ids.dim(1);
  const std::vector<float> pos = to_vector(ids);  // pos = ids.float()
  std::vector<float> cos_t(size_t(S * hd)), sin_t(size_t(S * hd));
  int64_t col = 0;
  for (int64_t a = 0; a < n_axes; ++a) {
    const int64_t d = axes_dim[size_t(a)];
    for (int64_t j = 0; j < d / 2; ++j) {
      const double freq = 1.0 / std::pow(theta, double(2 * j) / double(d));
      for (int64_t s = 0; s < S; ++s) {
        const double phase = double(pos[size_t(s * n_axes + a)]) * freq;
        const float c = float(std::cos(phase)), sn = float(std::sin(phase));
        const size_t at = size_t(s * hd + col + 2 * j);
        cos_t[at] = cos_t[at + 1] = c;  // repeat_interleave(2): the pair shares one frequency
        sin_t[at] = sin_t[at + 1] = sn;
      }
    }
    col += d;
  }
  return RotaryTables::of(from_vector(cos_t, {S, hd}, DType::f32, ids.device()),
                          from_vector(sin_t, {S, hd}, DType::f32, ids.device()));
}

void check_axes_dims_rope(const std::vector<int64_t>& axes_dims, int64_t head_dim, const char* model,
                          const std::string& source) {
  int64_t rope_dim = 0;
  for (int64_t d : axes_dims) {
    KILN_CHECK(d > 0 && d % 2 == 0, model, source, ": every axes_dims_rope entry must be even and positive, got ", d);
    rope_dim += d;
  }
  KILN_CHECK(rope_dim == head_dim, model, source, ": sum(axes_dims_rope) = ", rope_dim,
             " must equal attention_head_dim = ", head_dim);
}

Tensor apply_rotary_emb(const Tensor& x, const RotaryTables& rope) {
  KILN_CHECK(x.rank() == 4, "apply_rotary_emb", "expects [B, S, H, hd], got ", to_string(x.shape()));
  const int64_t B = x.dim(0), S = x.dim(1), H = x.dim(2), hd = x.dim(3);
  KILN_CHECK(rope.cos.shape() == Shape({S, hd}), "apply_rotary_emb", "tables ", to_string(rope.cos.shape()),
             " do not match sequence ", S, " x head dim ", hd);
  const Tensor xf = cast(x, DType::f32);
  // In pairs (x[2i], x[2i+1]): x_rotated = (-x[2i+1], x[2i]) = the pair reversed (a view) times
  // (-1, 1), exactly; every product and sum is Diffusers' x*cos + x_rotated*sin, element by element.
  const Tensor pairs = reshape(xf, {B, S, H, hd / 2, 2});
  const Tensor rotated = flip(pairs, 4) * rope.pair_sign;
  const Tensor c = reshape(rope.cos, {1, S, 1, hd / 2, 2}), s = reshape(rope.sin, {1, S, 1, hd / 2, 2});
  return cast(reshape(pairs * c + rotated * s, {B, S, H, hd}), x.dtype());
}

Tensor rope_attention(const Tensor& q, const Tensor& k, const Tensor& v, const RotaryTables& rope) {
  const int64_t hd = q.dim(3);
  // SDPA wants [B, H, S, hd].
  const Tensor qh = transpose(apply_rotary_emb(q, rope), 1, 2);
  const Tensor kh = transpose(apply_rotary_emb(k, rope), 1, 2);
  const Tensor o = scaled_dot_product_attention(qh, kh, transpose(v, 1, 2), Tensor(), 1.0 / std::sqrt(double(hd)));
  return flatten(transpose(o, 1, 2), 2);
}

Tensor ids_2d(const Tensor& ids, const char* model, const char* name) {
  if (ids.rank() == 3) return squeeze(slice(ids, 0, 0, 1), 0);
  KILN_CHECK(ids.rank() == 2, model, name, " must be [L, n_axes], got ", to_string(ids.shape()));
  return ids;
}

namespace {
bool same_value(const Tensor& a, const Tensor& b) {
  return a.buffer() == b.buffer() && a.offset() == b.offset() && a.shape() == b.shape() &&
         a.strides() == b.strides() && a.dtype() == b.dtype();
}
}  // namespace

RotaryTables RotaryCache::get(const Tensor& img_ids, const Tensor& txt_ids,
                              const std::function<RotaryTables()>& make) const {
  std::lock_guard<std::mutex> lock(slot_->mu);
  const auto& e = slot_->entry;
  if (e && same_value(e->img_ids, img_ids) && same_value(e->txt_ids, txt_ids)) return e->tables;
  slot_->entry = std::make_shared<const Entry>(Entry{img_ids, txt_ids, make()});
  return slot_->entry->tables;
}

JointRotaryEmbedding::JointRotaryEmbedding(std::vector<int64_t> axes_dim, double theta, const char* model)
    : axes_dim_(std::move(axes_dim)), theta_(theta), model_(model) {}

RotaryTables JointRotaryEmbedding::operator()(const Tensor& img_ids, const Tensor& txt_ids) const {
  return flux_pos_embed(concat({ids_2d(txt_ids, model_, "txt_ids"), ids_2d(img_ids, model_, "img_ids")}, 0), axes_dim_,
                        theta_);
}

RotaryTables JointRotaryEmbedding::for_step(const Tensor& img_ids, const Tensor& txt_ids, int64_t l_img,
                                            int64_t l_txt) const {
  const Tensor img = ids_2d(img_ids, model_, "img_ids"), txt = ids_2d(txt_ids, model_, "txt_ids");
  const int64_t n_axes = int64_t(axes_dim_.size());
  KILN_CHECK(img.dim(0) == l_img && txt.dim(0) == l_txt && img.dim(1) == n_axes && txt.dim(1) == n_axes, model_,
             "img_ids ", to_string(img.shape()), " / txt_ids ", to_string(txt.shape()), " must be [", l_img, ", ",
             n_axes, "] / [", l_txt, ", ", n_axes, "] (the image / text sequence lengths)");
  return cache_.get(img_ids, txt_ids, [&] { return (*this)(img_ids, txt_ids); });
}

RotaryTables JointRotaryEmbedding::placeholder(int64_t rows, int64_t head_dim) {
  return RotaryTables::of(placeholder_tensor({rows, head_dim}, DType::f32),
                          placeholder_tensor({rows, head_dim}, DType::f32));
}

}  // namespace kiln::nn
