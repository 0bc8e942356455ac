// Pre-packed linear weights on the CPU device (compiled mode, CompileOptions::prepack_weights).
//
// The first launch that reads a weight packs it into the GEMM primitive's blocked layout
// (kernels/linear_gemm.h) in device memory, and keeps the copy on the weight's buffer
// (Buffer::derived): later launches, steps and images reuse it, and the linear skips the
// packing it would otherwise do inside every call. The copy is dropped when the weight's bytes
// change (a later write), when they move, and when the weight dies. It costs one more copy of
// each multi-row linear's weight in device memory, so it is not made under a device memory
// capacity, nor for weights model offload brings in for one call (they would be packed again
// on every call).
#pragma once
#include <cstdint>
#include <memory>

#include "core/tensor.h"
#include "devices/cpu/kernels/linear_gemm.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

struct PrepackStats {
  uint64_t packed = 0;   // weights packed (each a reorder of the whole weight)
  uint64_t reused = 0;   // launches that found their weight packed already
  uint64_t skipped = 0;  // launches that did not get one (a capacity, offload, a failed packing)
  uint64_t bytes = 0;       // bytes packed so far
  uint64_t live_bytes = 0;  // device memory the packs alive now hold (allocator blocks)
};
PrepackStats prepack_stats();

// The packed form of linear weight `w` ([N,K], f32 or bf16, dense; packed in its own dtype) as the
// write numbered `after_write` left it (its buffer's ready_seq() when the reading launch was
// enqueued), made now when there is none; nullptr when `w` is not a dense f32 or bf16 matrix,
// when the device has a memory capacity (--device-memory: its fail-fast memory plan counts no new
// packed copies), when `w` was brought in by model offload, when packing would change the bits
// (linear_packing_keeps_bits) or when it fails (no memory); the linear then reads `w` as it is.
// Call it on the device queue, where `w`'s bytes are ready. Which linears ask for one:
// linear_reads_packed_weight.
std::shared_ptr<const PackedLinearWeight> prepacked_linear_weight(const Tensor& w, uint64_t after_write);

}  // namespace kiln::cpu::KILN_CPU_LEVEL
