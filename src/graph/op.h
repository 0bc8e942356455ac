// The op registry: every op the engine knows, with its shape/dtype inference and one
// simple reference implementation (used by tests as the oracle for device kernels).
// Device kernels live under src/devices/<name>; the three execution modes share these
// definitions.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/tensor.h"

namespace kiln {

// A dense host copy of a tensor's values (row-major), held as doubles for the reference code.
struct HostTensor {
  Shape shape;
  DType dtype = DType::f32;
  std::vector<double> data;

  int64_t numel() const { return kiln::numel(shape); }
};

// Result metadata an op's inference computes from its inputs' metadata.
struct OutputMeta {
  Shape shape;
  DType dtype = DType::f32;
};

// For view ops: where the output sits in the input's buffer.
struct ViewMeta {
  Shape shape;
  Strides strides;
  int64_t offset = 0;
};

enum class OpKind {
  elementwise,  // unary/binary/ternary maps with broadcasting (fusable)
  reduction,    // sum, mean, max, var, and norms/softmax built on them
  movement,     // views and data movement
  contraction,  // matmul, linear, conv2d
  attention,
  factory,      // no tensor inputs (arange, full)
  collective,   // all_reduce, all_gather across this process's world
};

struct OpDef {
  std::string name;
  OpKind kind = OpKind::elementwise;
  int min_inputs = 1;
  int max_inputs = 1;  // -1: any number
  // Validates inputs/attrs and returns the output's metadata. Errors start with "[name]".
  std::function<OutputMeta(const std::vector<Tensor>&, const Attrs&)> infer;
  // Set for ops that are views: no kernel runs, the output shares the input's buffer.
  std::function<ViewMeta(const Tensor&, const Attrs&)> view;
  // Whether device kernels read strided inputs directly; otherwise the dispatcher hands them
  // dense copies of non-contiguous views.
  bool strided_inputs = false;
  // The input that may be held in a quantized storage type (core/quant_blocks.h): linear's
  // weight. Any other input of a storage type is refused by the dispatcher, naming the op.
  int quantized_input = -1;
  // The reference: computes the output from dense host inputs (`out` gives shape and dtype;
  // the result is rounded to out.dtype by the caller).
  std::function<std::vector<double>(const std::vector<HostTensor>&, const Attrs&, const OutputMeta&)>
      reference;
};

// Looks an op up by name; throws "[ops] unknown op 'x'".
const OpDef& op_def(const std::string& name);
std::vector<std::string> op_names();
void register_op(OpDef def);

// Runs the reference implementation (rounding the result to the output dtype).
HostTensor reference_run(const std::string& op, const std::vector<HostTensor>& inputs,
                         const Attrs& attrs, const OutputMeta& out);

}  // namespace kiln

namespace kiln {
// Strides that let `to` view a tensor of shape `from` with `strides` without a copy, if any.
std::optional<Strides> reshape_strides(const Shape& from, const Strides& strides, const Shape& to);
}  // namespace kiln
