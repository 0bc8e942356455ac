// The elementwise op vocabulary, shared by the reference code (graph/ops) and every
// device's kernels, so that one enum value means one formula everywhere.
#pragma once
#include <optional>
#include <string>

namespace kiln {

enum class UnaryOp {
  neg, abs, exp, log, sqrt, rsqrt, tanh, sin, cos, sigmoid, relu, silu,
  gelu,        // x/2 (1 + erf(x/sqrt 2))
  gelu_tanh,   // x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  quick_gelu,  // x sigmoid(1.702 x)
  clamp,       // attrs min, max (either may be absent)
};

enum class BinaryOp { add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge };

const char* unary_name(UnaryOp op);
const char* binary_name(BinaryOp op);
std::optional<UnaryOp> unary_from_name(const std::string& name);
std::optional<BinaryOp> binary_from_name(const std::string& name);
bool is_comparison(BinaryOp op);
// Unary ops that keep integer inputs integer (the rest compute floats).
bool keeps_integer(UnaryOp op);

// Reference formulas in double precision.
double unary_ref(UnaryOp op, double x, double lo, double hi);
double binary_ref(BinaryOp op, double a, double b);

}  // namespace kiln
