#include "graph/elementwise.h"

#include <cmath>

namespace kiln {

namespace {
constexpr const char* kUnaryNames[] = {"neg",  "abs",     "exp",  "log",  "sqrt",      "rsqrt",
                                       "tanh", "sin",     "cos",  "sigmoid", "relu",   "silu",
                                       "gelu", "gelu_tanh", "quick_gelu", "clamp"};
constexpr const char* kBinaryNames[] = {"add",     "sub",     "mul", "div", "pow", "maximum", "minimum",
                                        "eq",      "ne",      "lt",  "le",  "gt",  "ge"};
}  // namespace

const char* unary_name(UnaryOp op) { return kUnaryNames[int(op)]; }
const char* binary_name(BinaryOp op) { return kBinaryNames[int(op)]; }

std::optional<UnaryOp> unary_from_name(const std::string& name) {
  for (int i = 0; i < int(std::size(kUnaryNames)); ++i)
    if (name == kUnaryNames[i]) return UnaryOp(i);
  return std::nullopt;
}

std::optional<BinaryOp> binary_from_name(const std::string& name) {
  for (int i = 0; i < int(std::size(kBinaryNames)); ++i)
    if (name == kBinaryNames[i]) return BinaryOp(i);
  return std::nullopt;
}

bool is_comparison(BinaryOp op) { return op >= BinaryOp::eq; }

bool keeps_integer(UnaryOp op) {
  return op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::relu || op == UnaryOp::clamp;
}

double unary_ref(UnaryOp op, double x, double lo, double hi) {
  const double sig = 1.0 / (1.0 + std::exp(-x));
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::abs: return std::fabs(x);
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return 1.0 / std::sqrt(x);
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::sin: return std::sin(x);
    case UnaryOp::cos: return std::cos(x);
    case UnaryOp::sigmoid: return sig;
    case UnaryOp::relu: return x > 0 ? x : 0.0;
    case UnaryOp::silu: return x * sig;
    case UnaryOp::gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case UnaryOp::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case UnaryOp::quick_gelu: return x / (1.0 + std::exp(-1.702 * x));
    case UnaryOp::clamp: return std::fmin(std::fmax(x, lo), hi);
  }
  return 0;
}

double binary_ref(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::pow: return std::pow(a, b);
    case BinaryOp::maximum: return std::fmax(a, b);
    case BinaryOp::minimum: return std::fmin(a, b);
    case BinaryOp::eq: return a == b;
    case BinaryOp::ne: return a != b;
    case BinaryOp::lt: return a < b;
    case BinaryOp::le: return a <= b;
    case BinaryOp::gt: return a > b;
    case BinaryOp::ge: return a >= b;
  }
  return 0;
}

}  // namespace kiln
