// What every oneDNN-backed CPU kernel shares: the engine, a stream per thread, and
// user-managed scratchpads (the oneDNN docs require them for executing one primitive from
// several threads at once; every call then allocates its own).
#pragma once
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "core/dtype.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL::onednn {

// Never destroyed: at process exit the device queue may still be running a primitive, and
// static destructors must not pull the engine from under it.
dnnl::engine& engine();
dnnl::stream& thread_stream();

dnnl::primitive_attr user_scratchpad_attr();

using Args = std::unordered_map<int, dnnl::memory>;

// Gives a primitive created with user_scratchpad_attr() its own scratchpad for this call.
void add_scratchpad(Args& args, const dnnl::memory::desc& scratchpad);

// oneDNN's name for an f32 or bf16 tensor's dtype (the two the oneDNN kernels take).
dnnl::memory::data_type data_type(DType t);

// Whether oneDNN runs this CPU with every instruction of `isa` (its ISA values are bit masks,
// each including the ones below it).
bool cpu_has(dnnl::cpu_isa isa);

// Whether this CPU multiplies bf16 at least twice as fast as f32, so that bf16 kernels (linears,
// convolutions, attention's tile products) should multiply in bf16 rather than widen to f32: AMX,
// and AMD's AVX512-BF16 cores (Zen 4/5), where vdpbf16ps does twice an f32 FMA's multiply-adds.
// Intel's AVX512-BF16 cores without AMX retire it at half that rate: there bf16 multiplies no
// faster than f32. Fixed for the process.
bool bf16_dot_products_fast();

// Whether oneDNN has bf16 kernels on this CPU at all: AVX-512 (avx512_core), where CPUs without
// AVX512-BF16 emulate the multiplies. On AVX2-only CPUs it has none, and kiln's bf16 kernels widen
// to f32 (bf16_dot_products_fast() is false there too).
bool bf16_primitives_available();

}  // namespace kiln::cpu::KILN_CPU_LEVEL::onednn
