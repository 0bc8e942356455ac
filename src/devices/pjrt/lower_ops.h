// kiln's ops as StableHLO (the PJRT device's programs), on typed values: every op of the registry
// that a pipeline runs, computing as kiln's own kernels do — floats in f32 (dots and convolutions
// at HIGHEST precision, reductions and softmax upcast), rounded once into the output's dtype — so
// that XLA's results match the CPU device's within rounding. XLA fuses and schedules them itself.
#pragma once
#include <string>
#include <vector>

#include "core/attrs.h"
#include "devices/pjrt/stablehlo.h"
#include "devices/runtime.h"

namespace kiln::pjrt {

// Whether `op` on inputs like these lowers; otherwise false with `why` naming what does not.
bool lowerable(const std::string& op, const std::vector<OperandMeta>& inputs, std::string* why);

// `op` applied to `in` (values of the inputs' shapes and element types), giving a value of
// `out_shape` in `out_dtype`'s element type. The collectives (all_reduce, all_gather) lower to
// StableHLO's over every one of the program's `replicas` replicas: one replica per tensor-parallel
// rank, each holding its own slices.
Value lower_op(FunctionBuilder& b, const std::string& op, const Attrs& attrs, const std::vector<Value>& in,
               const Shape& out_shape, DType out_dtype, int replicas = 1);

// The strided view (shape, strides and offset in elements, strides may be 0 or negative) of the
// elements of the 1-D value `flat`, as a dense value: slices, reshapes and transposes where the
// view is a permuted block, a gather of computed indices otherwise.
Value strided_view(FunctionBuilder& b, const Value& flat, int64_t offset, const Shape& shape, const Strides& strides);

}  // namespace kiln::pjrt
