// The CPU's fused elementwise kernel of deferred-and-fused mode: a fused
// program (graph/fused_program.h) evaluated in ONE pass over cache-sized tiles of the output, with
// every intermediate held in per-thread f32 tiles instead of device memory.
//
// Equality with strict eager is by construction: the kernel uses the eager tile driver
// (tiles.h) to load inputs and store the output, the same f32 formulas (elementwise_math.h)
// for every op, and `round` instructions to reproduce the store-then-load through an
// intermediate's storage dtype that eager performs between ops. A program that mirrors an
// eager op chain (one `round` after each op whose eager output dtype is not f32) therefore
// gives bit-identical results.
#pragma once
#include <vector>

#include "core/tensor_view.h"
#include "graph/fused_program.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// Evaluates `program` over the output's index space in tiles (the same tile driver as eager),
// reading each input through its strides broadcast to the output shape, never materialising
// intermediates in memory. `out` must be dense and must not overlap any input. Instructions
// the result does not depend on are skipped. Throws "[fused] ..." for an invalid program,
// an input that does not broadcast to the output shape, or a non-dense output.
void fused_elementwise(const FusedProgram& program, const std::vector<TensorView>& inputs, const TensorView& out);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
