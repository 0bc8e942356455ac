#include "devices/cpu/kernels/elementwise_math.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

namespace kiln::cpu::inline KILN_CPU_LEVEL {

namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

namespace {

// exp() clamped into the range Highway's Exp is defined on; large inputs overflow to inf.
V exp_safe(D d, V x) {
  const V hi = hn::Set(d, 88.72283935546875f);
  const V lo = hn::Set(d, -103.0f);
  const V e = hn::Exp(d, hn::Max(hn::Min(x, hi), lo));
  const V inf = hn::Set(d, std::numeric_limits<float>::infinity());
  return hn::IfThenElse(hn::Gt(x, hi), inf, hn::IfThenElseZero(hn::Ge(x, lo), e));
}

V sigmoid_v(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, exp_safe(d, hn::Neg(x))));
}

// Applies `f` to full vectors, and to the tail through a zero-padded vector so that the last
// elements get exactly the same arithmetic as the rest.
template <typename F>
void map_unary(const float* x, float* y, int64_t n, F f) {
  const D d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(f(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float buf[hn::MaxLanes(d)] = {};
    std::memcpy(buf, x + i, size_t(n - i) * 4);
    hn::Store(f(d, hn::Load(d, buf)), d, buf);
    std::memcpy(y + i, buf, size_t(n - i) * 4);
  }
}

template <typename F>
void map_binary(const float* a, const float* b, float* y, int64_t n, F f) {
  const D d;
  const int64_t lanes = int64_t(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(f(d, hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, y + i);
  if (i < n) {
    HWY_ALIGN float ba[hn::MaxLanes(d)] = {};
    HWY_ALIGN float bb[hn::MaxLanes(d)] = {};
    std::memcpy(ba, a + i, size_t(n - i) * 4);
    std::memcpy(bb, b + i, size_t(n - i) * 4);
    hn::Store(f(d, hn::Load(d, ba), hn::Load(d, bb)), d, ba);
    std::memcpy(y + i, ba, size_t(n - i) * 4);
  }
}

V cmp_result(D d, hn::Mask<D> m) { return hn::IfThenElseZero(m, hn::Set(d, 1.0f)); }

}  // namespace

void unary_f32(UnaryOp op, const float* x, float* y, int64_t n, float lo, float hi) {
  switch (op) {
    case UnaryOp::neg: return map_unary(x, y, n, [](D, V v) { return hn::Neg(v); });
    case UnaryOp::abs: return map_unary(x, y, n, [](D, V v) { return hn::Abs(v); });
    case UnaryOp::exp: return map_unary(x, y, n, [](D d, V v) { return exp_safe(d, v); });
    case UnaryOp::log:
      return map_unary(x, y, n, [](D d, V v) {
        const V r = hn::Log(d, hn::Max(v, hn::Set(d, std::numeric_limits<float>::min())));
        const V zero = hn::Zero(d);
        return hn::IfThenElse(hn::Eq(v, zero), hn::Set(d, -std::numeric_limits<float>::infinity()),
                              hn::IfThenElse(hn::Lt(v, zero), hn::Set(d, std::numeric_limits<float>::quiet_NaN()), r));
      });
    case UnaryOp::sqrt: return map_unary(x, y, n, [](D, V v) { return hn::Sqrt(v); });
    case UnaryOp::rsqrt: return map_unary(x, y, n, [](D d, V v) { return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(v)); });
    case UnaryOp::tanh: return map_unary(x, y, n, [](D d, V v) { return hn::Tanh(d, v); });
    case UnaryOp::sin: return map_unary(x, y, n, [](D d, V v) { return hn::Sin(d, v); });
    case UnaryOp::cos: return map_unary(x, y, n, [](D d, V v) { return hn::Cos(d, v); });
    case UnaryOp::sigmoid: return map_unary(x, y, n, [](D d, V v) { return sigmoid_v(d, v); });
    case UnaryOp::relu: return map_unary(x, y, n, [](D d, V v) { return hn::Max(v, hn::Zero(d)); });
    case UnaryOp::silu: return map_unary(x, y, n, [](D d, V v) { return hn::Mul(v, sigmoid_v(d, v)); });
    case UnaryOp::gelu:
      // erf has no SIMD version in Highway; erf-GELU is off the hot path of the target models
      // (they use the tanh form), so the scalar libm erf is used.
      for (int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
      return;
    case UnaryOp::gelu_tanh:
      return map_unary(x, y, n, [](D d, V v) {
        const V inner = hn::Mul(hn::Set(d, 0.7978845608028654f),
                                hn::MulAdd(hn::Mul(hn::Set(d, 0.044715f), hn::Mul(v, v)), v, v));
        return hn::Mul(hn::Mul(hn::Set(d, 0.5f), v), hn::Add(hn::Set(d, 1.0f), hn::Tanh(d, inner)));
      });
    case UnaryOp::quick_gelu:
      return map_unary(x, y, n, [](D d, V v) { return hn::Mul(v, sigmoid_v(d, hn::Mul(hn::Set(d, 1.702f), v))); });
    case UnaryOp::clamp:
      return map_unary(x, y, n, [lo, hi](D d, V v) { return hn::Min(hn::Max(v, hn::Set(d, lo)), hn::Set(d, hi)); });
  }
}

void binary_f32(BinaryOp op, const float* a, const float* b, float* y, int64_t n) {
  switch (op) {
    case BinaryOp::add: return map_binary(a, b, y, n, [](D, V p, V q) { return hn::Add(p, q); });
    case BinaryOp::sub: return map_binary(a, b, y, n, [](D, V p, V q) { return hn::Sub(p, q); });
    case BinaryOp::mul: return map_binary(a, b, y, n, [](D, V p, V q) { return hn::Mul(p, q); });
    case BinaryOp::div: return map_binary(a, b, y, n, [](D, V p, V q) { return hn::Div(p, q); });
    case BinaryOp::pow:
      for (int64_t i = 0; i < n; ++i) y[i] = std::pow(a[i], b[i]);
      return;
    case BinaryOp::maximum: return map_binary(a, b, y, n, [](D, V p, V q) { return hn::Max(p, q); });
    case BinaryOp::minimum: return map_binary(a, b, y, n, [](D, V p, V q) { return hn::Min(p, q); });
    case BinaryOp::eq: return map_binary(a, b, y, n, [](D d, V p, V q) { return cmp_result(d, hn::Eq(p, q)); });
    case BinaryOp::ne: return map_binary(a, b, y, n, [](D d, V p, V q) { return cmp_result(d, hn::Ne(p, q)); });
    case BinaryOp::lt: return map_binary(a, b, y, n, [](D d, V p, V q) { return cmp_result(d, hn::Lt(p, q)); });
    case BinaryOp::le: return map_binary(a, b, y, n, [](D d, V p, V q) { return cmp_result(d, hn::Le(p, q)); });
    case BinaryOp::gt: return map_binary(a, b, y, n, [](D d, V p, V q) { return cmp_result(d, hn::Gt(p, q)); });
    case BinaryOp::ge: return map_binary(a, b, y, n, [](D d, V p, V q) { return cmp_result(d, hn::Ge(p, q)); });
  }
}

void where_f32(const float* cond, const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = cond[i] != 0.0f ? a[i] : b[i];
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
