// The op API that models are written in (names follow PyTorch). Each function validates its
// arguments at the call site and dispatches one op (exec/dispatch.h); none waits for the
// device. Host scalars become 0-d tensors, so they are values, not baked constants.
#pragma once
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// ---- factories ----
Tensor scalar(double value, DType dtype = DType::f32, const Device& device = default_device());  // 0-d
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, const Device& device = default_device());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, const Device& device = default_device());
Tensor ones(const Shape& shape, DType dtype = DType::f32, const Device& device = default_device());
Tensor arange(double start, double end, double step = 1, DType dtype = DType::i64,
              const Device& device = default_device());

// ---- collectives over this process's world (distributed/process_group.h) ----
Tensor all_reduce(const Tensor& x);                  // sum over all ranks (in f32, rounded to x's dtype)
Tensor all_gather(const Tensor& x, int64_t axis);    // every rank's x joined along axis, rank order
// The same over a group of `world_size` ranks (a sharded layer's plan; ProcessGroup::world()'s above).
Tensor all_gather(const Tensor& x, int64_t axis, int64_t world_size);

// ---- elementwise ----
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor silu(const Tensor& x);
// approximate: "none" (erf) or "tanh", as in torch.nn.functional.gelu.
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
Tensor quick_gelu(const Tensor& x);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor cast(const Tensor& x, DType dtype);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// ---- reductions and normalisations ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
Tensor max(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false);
// correction 1 = unbiased (torch's default), 0 = population variance.
Tensor var(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdim = false, int64_t correction = 1);
Tensor softmax(const Tensor& x, int64_t axis = -1);
// Over the last dim. weight/bias optional (elementwise_affine=false leaves them empty).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps);
// then_silu: SiLU of the result in the same pass (silu(group_norm(x)), the same bits).
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, double eps,
                  bool then_silu = false);

// ---- contractions and attention ----
Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
// With a residual, conv2d(...) + residual: added inside the convolution (its result is never
// written alone) when the residual has the result's shape, dtype and layout; otherwise by `+`.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              std::vector<int64_t> stride = {1, 1}, std::vector<int64_t> padding = {0, 0},
              const Tensor& residual = Tensor());
// softmax(q k^T * scale + mask) v over [B, H, L, D]; scale defaults to 1/sqrt(D). k and v may have
// fewer heads Hkv (H a multiple of Hkv): grouped-query attention, query head h reads K/V head
// h / (H / Hkv), as torch's enable_gqa=True, without a copy of K/V.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& mask = Tensor(), std::optional<double> scale = std::nullopt);

// ---- movement (views where possible) ----
Tensor reshape(const Tensor& x, Shape shape);  // one dim may be -1; copies only if not viewable
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
Tensor flip(const Tensor& x, int64_t axis);  // reversed along axis (a view, negative stride)
Tensor expand(const Tensor& x, const Shape& shape);  // -1 keeps a dim
Tensor broadcast_to(const Tensor& x, const Shape& shape);
Tensor unsqueeze(const Tensor& x, int64_t axis);
Tensor squeeze(const Tensor& x, int64_t axis);
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor contiguous(const Tensor& x);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis);
Tensor gather(const Tensor& table, const Tensor& indices);  // embedding lookup along dim 0
// pads: (before, after) per dim, first dim first.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0);
Tensor upsample_nearest2x(const Tensor& x);
// `x` on `device`: itself when already there, else a dense copy (to_device, exec/host.h).
Tensor to(const Tensor& x, const Device& device);

// ---- memory format (PyTorch's torch.channels_last) ----
// A channels-last tensor is [N, C, H, W] whose memory is [N, H, W, C] (strides [HWC, 1, WC, C]).
// conv2d, group_norm, upsample_nearest2x and the elementwise ops keep that layout (their result is
// channels-last too), so a chain of them never reorders activations; any other op reads it as a
// strided view. contiguous() gives the NCHW copy.
bool is_channels_last(const Tensor& x);
Tensor to_channels_last(const Tensor& x);  // a channels-last copy (x itself when it is one)

}  // namespace kiln
