// The op conformance harness: every registered op runs through the dispatcher on the CPU
// device and is compared with its reference implementation, on random inputs, with
// broadcasting and non-contiguous views, for f32 and (where meaningful) bf16/f16 storage.
// Adding an op means adding a row to kCases; a test fails if an op has no row.
#include <set>

#include <cstring>

#include "devices/runtime.h"
#include "exec/compile.h"
#include "exec/deferred.h"
#include "exec/dispatch.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "graph/op.h"
#include "test_util.h"

namespace kiln {
namespace {

enum class Layout {
  dense,
  transposed,  // stored with the last two dims swapped, then permuted back (a strided view)
  strided,     // every other element of a tensor twice as long in the last dim
  broadcast,   // a size-1 leading dim expanded to `shape` (stride 0)
  heads,       // stored with dims 1 and 2 swapped, then transposed back ([B,L,H,D] seen as [B,H,L,D])
};

struct InputSpec {
  Shape shape;
  Layout layout = Layout::dense;
  double lo = -2, hi = 2;
  std::optional<DType> fixed_dtype;  // integer / bool inputs keep their dtype in every variant
};

struct OpCase {
  OpCase(std::string label_, std::string op_, std::vector<InputSpec> inputs_, Attrs attrs_ = {},
         double rtol_ = 1e-5, double atol_ = 1e-5, bool low_precision_ = true)
      : label(std::move(label_)), op(std::move(op_)), inputs(std::move(inputs_)), attrs(std::move(attrs_)),
        rtol(rtol_), atol(atol_), low_precision(low_precision_) {}
  std::string label;
  std::string op;
  std::vector<InputSpec> inputs;
  Attrs attrs;
  double rtol, atol;   // for f32 storage
  bool low_precision;  // also run with bf16 and f16 storage
};

InputSpec in(Shape s, Layout l = Layout::dense, double lo = -2, double hi = 2) { return {std::move(s), l, lo, hi, {}}; }
InputSpec positive(Shape s, Layout l = Layout::dense) { return {std::move(s), l, 0.1, 3, {}}; }
InputSpec booleans(Shape s) { return {std::move(s), Layout::dense, 0, 2, DType::boolean}; }
InputSpec indices(Shape s, int64_t vocab) { return {std::move(s), Layout::dense, 0, double(vocab), DType::i64}; }

// `computed`: the stored tensor is the result of a copy op rather than uploaded data, so in
// deferred mode the input is a pending value (seen through the layout's view) instead of a
// materialised graph input.
Tensor make_input(const InputSpec& spec, DType dtype, uint32_t seed, bool computed = false) {
  const DType t = spec.fixed_dtype.value_or(dtype);
  auto values_of = [&](const Shape& s) {
    auto v = test::random_values(numel(s), seed, spec.lo, spec.hi);
    if (!is_floating(t))
      for (float& x : v) x = std::floor(x);
    return v;
  };
  auto from_vector = [&](const std::vector<float>& v, const Shape& s, DType d) {
    const Tensor x = kiln::from_vector(v, s, d);
    return computed ? dispatch("copy", {x}) : x;
  };
  auto values = values_of;
  const Shape& s = spec.shape;
  switch (spec.layout) {
    case Layout::dense: return from_vector(values(s), s, t);
    case Layout::transposed: {
      Shape st = s;
      std::swap(st[st.size() - 1], st[st.size() - 2]);
      return transpose(from_vector(values(st), st, t), -1, -2);
    }
    case Layout::strided: {
      Shape big = s;
      big.back() *= 2;
      return slice(from_vector(values(big), big, t), -1, 0, big.back(), 2);
    }
    case Layout::heads: {
      Shape st = s;
      std::swap(st[1], st[2]);
      return transpose(from_vector(values(st), st, t), 1, 2);
    }
    case Layout::broadcast: {
      Shape one = s;
      one[0] = 1;
      return expand(from_vector(values(one), one, t), s);
    }
  }
  return Tensor();
}

const std::vector<OpCase>& cases() {
  using L = Layout;
  static const std::vector<OpCase> k = [] {
    std::vector<OpCase> c;
    for (const char* u : {"neg", "abs", "exp", "tanh", "sin", "cos", "sigmoid", "relu", "silu", "gelu", "gelu_tanh",
                          "quick_gelu"}) {
      c.push_back({std::string(u) + "/dense", u, {in({3, 37})}});
      c.push_back({std::string(u) + "/transposed", u, {in({5, 8, 9}, L::transposed)}});
    }
    for (const char* u : {"log", "sqrt", "rsqrt"}) {
      c.push_back({std::string(u) + "/dense", u, {positive({4, 33})}});
      c.push_back({std::string(u) + "/strided", u, {positive({6, 7}, L::strided)}});
    }
    c.push_back({"clamp/both", "clamp", {in({4, 50})}, Attrs{{"min", -0.5}, {"max", 0.75}}});
    c.push_back({"clamp/min_only", "clamp", {in({4, 50}, L::strided)}, Attrs{{"min", 0.1}}});
    c.push_back({"cast/to_f32", "cast", {in({3, 40}, L::transposed)}, Attrs{{"dtype", int64_t(DType::f32)}}});
    c.push_back({"cast/to_bf16", "cast", {in({3, 40})}, Attrs{{"dtype", int64_t(DType::bf16)}}, 4e-3, 1e-6});
    c.push_back({"cast/to_i32", "cast", {in({3, 40}, L::dense, -50, 50)}, Attrs{{"dtype", int64_t(DType::i32)}}});
    c.push_back({"cast/bool_to_f32", "cast", {booleans({5, 6})}, Attrs{{"dtype", int64_t(DType::f32)}}});
    for (const char* b : {"add", "sub", "mul", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge"}) {
      c.push_back({std::string(b) + "/same", b, {in({4, 70}), in({4, 70})}});
      c.push_back({std::string(b) + "/broadcast_row", b, {in({3, 5, 16}, L::transposed), in({16})}});
      c.push_back({std::string(b) + "/broadcast_both", b, {in({4, 1, 6}), in({1, 3, 6}, L::strided)}});
      c.push_back({std::string(b) + "/scalar", b, {in({2, 9}), in({})}});
    }
    c.push_back({"div/same", "div", {in({4, 70}), positive({4, 70})}});
    c.push_back({"div/broadcast", "div", {in({3, 5, 16}, L::transposed), positive({5, 1})}});
    c.push_back({"pow/scalar_exponent", "pow", {positive({3, 33}), in({}, L::dense, 0.5, 2.5)}, {}, 2e-5, 1e-5});
    c.push_back({"pow/broadcast", "pow", {positive({4, 9}), in({9}, L::dense, -1, 2)}, {}, 2e-5, 1e-5});
    c.push_back({"where/broadcast", "where", {booleans({4, 1, 10}), in({4, 3, 10}), in({10}, L::dense)}});
    c.push_back({"where/views", "where", {booleans({6, 8}), in({6, 8}, L::transposed), in({6, 8}, L::strided)}});

    for (const char* r : {"sum", "mean", "max", "var"}) {
      c.push_back({std::string(r) + "/last", r, {in({5, 7, 33})}, Attrs{{"axes", std::vector<int64_t>{-1}}}, 2e-5, 1e-5});
      c.push_back({std::string(r) + "/middle_keepdim", r, {in({5, 7, 33}, L::transposed)},
                   Attrs{{"axes", std::vector<int64_t>{1}}, {"keepdim", int64_t(1)}}, 2e-5, 1e-5});
      c.push_back({std::string(r) + "/two_axes", r, {in({4, 6, 5, 3})}, Attrs{{"axes", std::vector<int64_t>{0, 2}}},
                   2e-5, 1e-5});
      c.push_back({std::string(r) + "/all", r, {in({9, 13}, L::strided)}, Attrs{{"axes", std::vector<int64_t>{}}}, 2e-5, 1e-5});
    }
    c.push_back({"var/population", "var", {in({6, 40})}, Attrs{{"axes", std::vector<int64_t>{1}}, {"correction", int64_t(0)}},
                 2e-5, 1e-5});
    c.push_back({"softmax/last", "softmax", {in({4, 3, 77}, L::dense, -8, 8)}, Attrs{{"axis", int64_t(-1)}}});
    c.push_back({"softmax/middle", "softmax", {in({4, 9, 5}, L::transposed, -8, 8)}, Attrs{{"axis", int64_t(1)}}});
    c.push_back({"layer_norm/affine", "layer_norm", {in({2, 7, 96}, L::dense, -3, 5), in({96}), in({96})},
                 Attrs{{"eps", 1e-6}}, 2e-5, 2e-5});
    c.push_back({"layer_norm/plain_view", "layer_norm", {in({6, 48}, L::transposed)}, Attrs{{"eps", 1e-5}}, 2e-5, 2e-5});
    c.push_back({"rms_norm/weight", "rms_norm", {in({3, 5, 64}), in({64})}, Attrs{{"eps", 1e-6}}, 2e-5, 2e-5});
    c.push_back({"rms_norm/plain", "rms_norm", {in({7, 33}, L::strided)}, Attrs{{"eps", 1e-6}}, 2e-5, 2e-5});
    c.push_back({"group_norm/affine", "group_norm", {in({2, 32, 5, 6}), in({32}), in({32})},
                 Attrs{{"groups", int64_t(8)}, {"eps", 1e-6}}, 2e-5, 2e-5});
    c.push_back({"group_norm/plain", "group_norm", {in({1, 12, 7}, L::transposed)}, Attrs{{"groups", int64_t(3)}, {"eps", 1e-5}},
                 2e-5, 2e-5});
    c.push_back({"group_norm/silu", "group_norm", {in({2, 16, 5, 6}), in({16}), in({16})},
                 Attrs{{"groups", int64_t(4)}, {"eps", 1e-6}, {"activation", std::string("silu")}}, 2e-5, 2e-5});
    // Channels-last memory order [N, H, W, C]; 600 pixels span several of the kernel's pixel blocks.
    c.push_back({"group_norm/channels_last_silu", "group_norm", {in({1, 20, 30, 48}), in({48}), in({48})},
                 Attrs{{"groups", int64_t(8)}, {"eps", 1e-6}, {"channels_last", int64_t(1)},
                       {"activation", std::string("silu")}}, 2e-5, 2e-5});
    c.push_back({"group_norm/channels_last", "group_norm", {in({2, 5, 6, 12})},
                 Attrs{{"groups", int64_t(3)}, {"eps", 1e-5}, {"channels_last", int64_t(1)}}, 2e-5, 2e-5});

    c.push_back({"matmul/plain", "matmul", {in({33, 47}), in({47, 29})}, {}, 1e-4, 1e-4});
    c.push_back({"matmul/transpose_b", "matmul", {in({2, 17, 40}), in({23, 40})}, Attrs{{"transpose_b", int64_t(1)}}, 1e-4, 1e-4});
    c.push_back({"matmul/transpose_a", "matmul", {in({3, 40, 17}), in({3, 40, 9})}, Attrs{{"transpose_a", int64_t(1)}}, 1e-4, 1e-4});
    c.push_back({"matmul/batch_broadcast", "matmul", {in({2, 1, 8, 16}, L::transposed), in({3, 16, 5})}, {}, 1e-4, 1e-4});
    c.push_back({"linear/bias", "linear", {in({2, 9, 64}), in({48, 64}), in({48})}, {}, 1e-4, 1e-4});
    c.push_back({"linear/no_bias_view", "linear", {in({10, 32}, L::transposed), in({20, 32})}, {}, 1e-4, 1e-4});
    c.push_back({"conv2d/3x3_pad1", "conv2d", {in({2, 3, 9, 10}), in({4, 3, 3, 3}), in({4})},
                 Attrs{{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{1, 1}}}, 1e-4, 1e-4});
    c.push_back({"conv2d/stride2", "conv2d", {in({1, 4, 11, 8}, L::transposed), in({5, 4, 3, 3})},
                 Attrs{{"stride", std::vector<int64_t>{2, 2}}, {"padding", std::vector<int64_t>{0, 0}}}, 1e-4, 1e-4});
    c.push_back({"conv2d/channels_last", "conv2d", {in({2, 9, 10, 3}), in({4, 3, 3, 3}), in({4})},
                 Attrs{{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{1, 1}},
                       {"channels_last", int64_t(1)}}, 1e-4, 1e-4});
    c.push_back({"conv2d/channels_last_stride2", "conv2d", {in({1, 11, 8, 4}), in({5, 4, 3, 3})},
                 Attrs{{"stride", std::vector<int64_t>{2, 2}}, {"padding", std::vector<int64_t>{0, 0}},
                       {"channels_last", int64_t(1)}}, 1e-4, 1e-4});
    c.push_back({"conv2d/1x1", "conv2d", {in({1, 8, 5, 5}), in({6, 8, 1, 1}), in({6})},
                 Attrs{{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{0, 0}}}, 1e-4, 1e-4});
    // A residual (the last input) added to the result: with a bias, without one (three inputs, the
    // third the residual), channels-last (where a bf16 primitive adds it itself, conv2d.h).
    c.push_back({"conv2d/residual", "conv2d", {in({2, 3, 9, 10}), in({4, 3, 3, 3}), in({4}), in({2, 4, 9, 10})},
                 Attrs{{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{1, 1}},
                       {"residual", int64_t(1)}}, 1e-4, 1e-4});
    c.push_back({"conv2d/channels_last_residual", "conv2d",
                 {in({2, 9, 10, 16}), in({8, 16, 3, 3}), in({8}), in({2, 9, 10, 8})},
                 Attrs{{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{1, 1}},
                       {"channels_last", int64_t(1)}, {"residual", int64_t(1)}}, 1e-4, 1e-4});
    c.push_back({"conv2d/channels_last_residual_no_bias", "conv2d", {in({1, 6, 7, 32}), in({16, 32, 1, 1}), in({1, 6, 7, 16})},
                 Attrs{{"stride", std::vector<int64_t>{1, 1}}, {"padding", std::vector<int64_t>{0, 0}},
                       {"channels_last", int64_t(1)}, {"residual", int64_t(1)}}, 1e-4, 1e-4});
    c.push_back({"flip/last", "flip", {in({3, 5, 2})}, Attrs{{"axis", int64_t(-1)}}});
    c.push_back({"flip/transposed", "flip", {in({4, 6, 5}, L::transposed)}, Attrs{{"axis", int64_t(1)}}});
    c.push_back({"sdpa/plain", "sdpa", {in({2, 3, 37, 16}), in({2, 3, 53, 16}), in({2, 3, 53, 8})}, {}, 1e-4, 1e-4});
    c.push_back({"sdpa/mask_scale", "sdpa", {in({1, 2, 20, 8}), in({1, 2, 30, 8}), in({1, 2, 30, 8}), in({1, 1, 20, 30}, L::dense, -4, 0)},
                 Attrs{{"scale", 0.3}}, 1e-4, 1e-4});
    // The FLUX layout: per-head projections [B,L,H,D] read in place as [B,H,L,D]; a strided mask.
    c.push_back({"sdpa/heads_layout", "sdpa", {in({1, 3, 19, 16}, L::heads), in({1, 3, 23, 16}, L::heads),
                 in({1, 3, 23, 8}, L::heads), in({1, 3, 19, 23}, L::transposed, -4, 0)}, {}, 1e-4, 1e-4});
    c.push_back({"sdpa/views", "sdpa", {in({1, 2, 24, 16}, L::transposed), in({1, 2, 24, 16}, L::strided), in({1, 2, 24, 16})},
                 {}, 1e-4, 1e-4});

    c.push_back({"reshape/merge", "reshape", {in({4, 6, 5})}, Attrs{{"shape", std::vector<int64_t>{24, 5}}}});
    c.push_back({"reshape/split_view", "reshape", {in({4, 6, 10}, L::strided)}, Attrs{{"shape", std::vector<int64_t>{2, 2, 6, 10}}}});
    c.push_back({"permute/3d", "permute", {in({3, 4, 5})}, Attrs{{"dims", std::vector<int64_t>{2, 0, 1}}}});
    c.push_back({"slice/step", "slice", {in({5, 12}, L::transposed)},
                 Attrs{{"axis", int64_t(1)}, {"start", int64_t(1)}, {"end", int64_t(-1)}, {"step", int64_t(3)}}});
    c.push_back({"expand/leading", "expand", {in({1, 7})}, Attrs{{"shape", std::vector<int64_t>{3, 4, -1}}}});
    c.push_back({"copy/transposed", "copy", {in({6, 7}, L::transposed)}});
    c.push_back({"copy/broadcast", "copy", {in({3, 4, 5}, L::broadcast)}});
    c.push_back({"concat/axis1", "concat", {in({2, 3, 4}), in({2, 5, 4}, L::transposed), in({2, 1, 4})}, Attrs{{"axis", int64_t(1)}}});
    c.push_back({"concat/last", "concat", {in({3, 2}), in({3, 7}, L::strided)}, Attrs{{"axis", int64_t(-1)}}});
    c.push_back({"pad/2d", "pad", {in({3, 4, 5}, L::transposed)},
                 Attrs{{"pads", std::vector<int64_t>{0, 0, 1, 2, 3, 0}}, {"value", -1.5}}});
    c.push_back({"gather/embedding", "gather", {in({11, 6}), indices({2, 7}, 11)}});
    // Collectives in a world of one rank (the multi-rank cases are test_tensor_parallel.cc's).
    c.push_back({"all_reduce/strided", "all_reduce", {in({4, 6}, L::strided)}, {}, 1e-5, 1e-5, false});
    c.push_back({"all_gather/last", "all_gather", {in({3, 5}, L::transposed)},
                 Attrs{{"axis", int64_t(1)}, {"world_size", int64_t(1)}}});
    c.push_back({"upsample_nearest2x/nchw", "upsample_nearest2x", {in({2, 3, 4, 5}, L::transposed)}});
    c.push_back({"upsample_nearest2x/channels_last", "upsample_nearest2x", {in({2, 4, 5, 3})},
                 Attrs{{"channels_last", int64_t(1)}}});
    c.push_back({"arange/float", "arange", {}, Attrs{{"start", 0.5}, {"end", 9.0}, {"step", 0.75}, {"dtype", int64_t(DType::f32)}}});
    c.push_back({"arange/int", "arange", {}, Attrs{{"start", -3.0}, {"end", 20.0}, {"step", 2.0}, {"dtype", int64_t(DType::i64)}},
                 1e-5, 1e-5, false});
    c.push_back({"full/f32", "full", {}, Attrs{{"shape", std::vector<int64_t>{3, 5}}, {"value", 2.25}, {"dtype", int64_t(DType::f32)}}});
    return c;
  }();
  return k;
}

struct Variant {
  OpCase c;
  DType dtype;
};

std::string variant_name(const testing::TestParamInfo<Variant>& info) {
  std::string s = info.param.c.label + "_" + dtype_name(info.param.dtype);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  for (const OpCase& c : cases()) {
    v.push_back({c, DType::f32});
    if (c.low_precision) {
      v.push_back({c, DType::bf16});
      v.push_back({c, DType::f16});
    }
  }
  return v;
}

void PrintTo(const Variant& v, std::ostream* os) { *os << v.c.label << " (" << dtype_name(v.dtype) << ")"; }

class OpConformance : public testing::TestWithParam<Variant> {};

TEST_P(OpConformance, MatchesReference) {
  const DefaultDeviceGuard on_device(test::test_device());
  const OpCase& c = GetParam().c;
  const DType dtype = GetParam().dtype;
  std::vector<Tensor> inputs;
  std::vector<HostTensor> host;
  uint32_t seed = 1234;
  for (const InputSpec& spec : c.inputs) {
    inputs.push_back(make_input(spec, dtype, seed++));
    host.push_back(to_host(inputs.back()));  // the values the kernel sees, already rounded
  }
  Attrs attrs = c.attrs;
  // Factories take their dtype from attrs: run them in the variant's dtype.
  if (inputs.empty() && attrs.has("dtype") && is_floating(DType(attrs.get_int("dtype"))))
    attrs.set("dtype", int64_t(dtype));
  const Tensor out = dispatch(c.op, inputs, attrs);
  const OutputMeta meta{out.shape(), out.dtype()};
  const HostTensor expected = reference_run(c.op, host, attrs, meta);
  const HostTensor got = to_host(out);
  ASSERT_EQ(got.shape, expected.shape);
  // Low-precision storage: the kernel rounds once from f32, the reference once from double,
  // so they may differ by one unit in the last place of the storage type.
  const bool low = dtype != DType::f32 && is_floating(out.dtype()) && out.dtype() != DType::f32;
  const double rtol = low ? (dtype == DType::bf16 ? 1.6e-2 : 2e-3) : c.rtol;
  const double atol = low ? (dtype == DType::bf16 ? 1.6e-2 : 2e-3) : c.atol;
  EXPECT_LE(test::closeness(got.data, expected.data, rtol, atol), 1.0) << c.label << " in " << dtype_name(dtype);
}

bool same_bits(const HostTensor& a, const HostTensor& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.data.size() == b.data.size() &&
         std::memcmp(a.data.data(), b.data.data(), a.data.size() * sizeof(double)) == 0;
}

// What a mode's result must be to strict eager's: the same bits where kiln runs the graph's
// launches (each element computed with the same operations in the same order); within the
// reference's bounds on a device that compiles each graph whole (PJRT: XLA fuses a graph its own
// way, contracting a multiply and the add after it into one fused multiply-add, while strict
// eager's per-op programs round in between).
bool same_result(const HostTensor& got, const HostTensor& eager, const OpCase& c) {
  if (!runtime(test::test_device()).runs_whole_graphs()) return same_bits(got, eager);
  if (got.shape != eager.shape || got.dtype != eager.dtype) return false;
  const bool low = got.dtype == DType::bf16 || got.dtype == DType::f16;
  const double tol = low ? (got.dtype == DType::bf16 ? 1.6e-2 : 2e-3) : std::max(c.rtol, 1e-5);
  return test::closeness(got.data, eager.data, tol, tol) <= 1.0;
}

// Deferred-and-fused mode must give exactly strict eager's bits (a fused kernel
// computes each element with the same operations in the same order), for the op alone and as
// the producer of an elementwise epilogue (which deferred mode fuses into the op's own launch,
// or into one fused elementwise kernel), with inputs that are uploaded tensors or pending
// values seen through views.
TEST_P(OpConformance, DeferredEqualsStrictEager) {
  const DefaultDeviceGuard on_device(test::test_device());
  const OpCase& c = GetParam().c;
  const DType dtype = GetParam().dtype;
  Attrs attrs = c.attrs;
  if (c.inputs.empty() && attrs.has("dtype") && is_floating(DType(attrs.get_int("dtype"))))
    attrs.set("dtype", int64_t(dtype));
  // With an epilogue, only the epilogue's result is held when it is read: the op's own output is
  // then a fused intermediate, as in a model.
  auto run_one = [&](bool computed_inputs, bool with_epilogue) {
    std::vector<Tensor> inputs;
    uint32_t seed = 1234;
    for (const InputSpec& spec : c.inputs) inputs.push_back(make_input(spec, dtype, seed++, computed_inputs));
    Tensor result = dispatch(c.op, inputs, attrs);
    if (with_epilogue) result = cast(result, DType::f32) * 1.5 + 0.25;  // drops the op's own handle
    return to_host(result);
  };
  auto run = [&](bool computed_inputs) {
    return std::make_pair(run_one(computed_inputs, false), run_one(computed_inputs, true));
  };
  const auto eager = run(false);
  for (bool computed : {false, true}) {
    reset_deferred_stats();
    EagerModeGuard defer(EagerMode::DeferAndFuse);
    const auto deferred = run(computed);
    EXPECT_TRUE(same_result(deferred.first, eager.first, c)) << c.label << " alone, computed inputs " << computed;
    EXPECT_TRUE(same_result(deferred.second, eager.second, c))
        << c.label << " with an epilogue, computed inputs " << computed;
    EXPECT_GT(deferred_stats().graphs_run, 0u) << "the op did not run as a deferred graph";
  }
}

// Compiled mode too (results must not depend on the mode): the op traced into an
// executable, alone and with an epilogue, its inputs passed as args (made dense by the call)
// or as parameters (bound in place, views and all).
TEST_P(OpConformance, CompiledEqualsStrictEager) {
  const DefaultDeviceGuard on_device(test::test_device());
  const OpCase& c = GetParam().c;
  const DType dtype = GetParam().dtype;
  Attrs attrs = c.attrs;
  if (c.inputs.empty() && attrs.has("dtype") && is_floating(DType(attrs.get_int("dtype"))))
    attrs.set("dtype", int64_t(dtype));
  std::vector<Tensor> inputs;
  uint32_t seed = 1234;
  for (const InputSpec& spec : c.inputs) inputs.push_back(make_input(spec, dtype, seed++));
  auto op = [&](const std::vector<Tensor>& in, bool with_epilogue) {
    Tensor r = dispatch(c.op, in, attrs);
    return with_epilogue ? cast(r, DType::f32) * 1.5 + 0.25 : r;
  };
  for (bool with_epilogue : {false, true}) {
    const HostTensor eager = to_host(op(inputs, with_epilogue));
    for (bool as_params : {false, true}) {
      // as_params: the traced function reads the captured inputs, which the call binds as parameters.
      const CompiledFunction f(
          c.label,
          [&](const std::vector<Tensor>& args) { return std::vector<Tensor>{op(as_params ? inputs : args, with_epilogue)}; },
          CompileOptions{});
      const uint64_t calls = compile_stats().calls;
      const std::vector<Tensor> out =
          as_params ? f({}, inputs) : f(inputs, {});
      EXPECT_EQ(compile_stats().calls, calls + 1) << "the op did not run as a compiled executable";
      EXPECT_TRUE(same_result(to_host(out.at(0)), eager, c))
          << c.label << (with_epilogue ? " with an epilogue" : " alone") << (as_params ? ", params" : ", args");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, OpConformance, testing::ValuesIn(variants()), variant_name);

TEST(OpConformanceCoverage, EveryRegisteredOpHasACase) {
  std::set<std::string> covered;
  for (const OpCase& c : cases()) covered.insert(c.op);
  for (const std::string& op : op_names()) EXPECT_TRUE(covered.count(op)) << "op '" << op << "' has no harness row";
}

}  // namespace
}  // namespace kiln
