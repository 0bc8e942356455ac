// Writing StableHLO as MLIR text, the program format every PJRT plugin compiles: a function's
// arguments, one SSA value per instruction, its results. Only the instructions kiln's lowering
// (lower_ops.h) uses; each checks nothing beyond what the text needs (XLA verifies the program).
#pragma once
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"

namespace kiln::pjrt {

// A tensor of the program: its SSA name, shape and element type ("f32", "bf16", "f16", "f64",
// "i32", "i64", "i1" for bool, "ui8" for raw bytes).
struct Value {
  std::string id;
  Shape shape;
  std::string elem;
  int64_t numel() const { return kiln::numel(shape); }
};

// The element type holding kiln `dtype` ("i1" for bool); fails naming a storage-only type.
std::string element_type(DType dtype);
// "tensor<2x3xf32>".
std::string tensor_type(const Shape& shape, const std::string& elem);
inline std::string type_of(const Value& v) { return tensor_type(v.shape, v.elem); }
bool is_float_elem(const std::string& elem);

class FunctionBuilder {
 public:
  Value arg(const Shape& shape, const std::string& elem);
  // The function's text: `func.func public @main(...)`, returning `results` (one
  // `tf.aliasing_output` per result that reuses a donated argument: `aliases[i]` = argument
  // index or -1).
  std::string finish(const std::vector<Value>& results, const std::vector<int>& aliases = {}) const;
  // The same, in a module declaring `replicas` replicas (what a program with collectives runs on).
  std::string finish_module(const std::vector<Value>& results, int replicas, const std::vector<int>& aliases = {}) const;

  Value constant(double value, const std::string& elem);  // a 0-d constant
  Value splat(double value, const Shape& shape, const std::string& elem);
  Value convert(const Value& v, const std::string& elem);  // value conversion (floats to ints truncate)
  Value bitcast(const Value& v, const Shape& shape, const std::string& elem);
  Value reshape(const Value& v, const Shape& shape);
  Value transpose(const Value& v, const std::vector<int64_t>& perm);
  // `v`'s dim i becomes dim dims[i] of `shape` (size 1 dims broadcast).
  Value broadcast_in_dim(const Value& v, const Shape& shape, const std::vector<int64_t>& dims);
  // NumPy broadcasting of `v` to `shape` (trailing dims aligned).
  Value broadcast_to(const Value& v, const Shape& shape);
  Value slice(const Value& v, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
              const std::vector<int64_t>& strides);
  Value reverse(const Value& v, const std::vector<int64_t>& dims);
  Value concatenate(const std::vector<Value>& vs, int64_t dim);
  Value pad(const Value& v, double value, const std::vector<int64_t>& low, const std::vector<int64_t>& high);
  Value iota(const Shape& shape, int64_t dim, const std::string& elem);
  // An elementwise instruction of one or two operands of the same shape ("stablehlo.add", ...).
  Value unary(const std::string& op, const Value& a);
  Value binary(const std::string& op, const Value& a, const Value& b);
  Value compare(const std::string& direction, const Value& a, const Value& b);  // EQ, NE, LT, LE, GT, GE
  Value select(const Value& cond, const Value& a, const Value& b);
  // Reduces `dims` of `v` with stablehlo.add or stablehlo.maximum from `init`.
  Value reduce(const Value& v, const std::vector<int64_t>& dims, const std::string& op, double init);
  // dot_general at HIGHEST precision (f32 passes on every platform, TPUs included).
  Value dot_general(const Value& a, const Value& b, const std::vector<int64_t>& batch_a,
                    const std::vector<int64_t>& batch_b, const std::vector<int64_t>& contract_a,
                    const std::vector<int64_t>& contract_b, const Shape& out);
  // 2-D convolution, NCHW (or NHWC with channels_last) input, OIHW kernel.
  Value conv2d(const Value& x, const Value& w, const std::vector<int64_t>& stride, const std::vector<int64_t>& padding,
               bool channels_last, const Shape& out);
  // Rows of `table` (dim 0) picked by integer `indices`: indices.shape ++ table.shape[1:] (for a
  // 1-D table, its elements at `indices`).
  Value take_rows(const Value& table, const Value& indices);
  Value dynamic_update_slice(const Value& v, const Value& update, int64_t offset);  // 1-D
  // Collectives over one group of every replica 0..replicas-1 (the program's replica count):
  // the elementwise sum of `v`, and every replica's `v` joined along `dim` in replica order.
  Value all_reduce_sum(const Value& v, int replicas);
  Value all_gather(const Value& v, int64_t dim, int replicas);

 private:
  Value emit(const std::string& rhs, const Shape& shape, const std::string& elem);
  std::vector<Value> args_;
  std::ostringstream body_;
  int next_ = 0;
};

}  // namespace kiln::pjrt
