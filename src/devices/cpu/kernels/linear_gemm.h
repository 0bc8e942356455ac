// The GEMM of a linear layer, y[M,N] = x[M,K] · w[N,K]ᵀ (+ bias[N]), through oneDNN matmul
// primitives (on AVX-512 oneDNN picks its brgemm kernels), cached per shape and dtypes.
//
// f32: every execution mode runs its linears of 2..kPrimitiveMaxRows-1 rows here
// (linear_runs_on_primitive), so they all get the same bits. The weight is read either as the
// caller's plain [N,K] rows, which the primitive packs into its blocked layout inside each call,
// or from a PackedLinearWeight made once ahead of time (compiled mode pre-packs the weights of
// its executables), which skips that packing. Both run the same kernel and give identical bits
// (tests/test_cpu_gemm_attention.cc).
//
// Why rows decide: at the row counts of a DiT step's text stream and small images dnnl_sgemm
// is far from peak, while from ~1k rows on it is as fast as the primitive reading plain
// weights, or faster (bench/bench_linear; the primitive reading plain weights was 0.92-0.98x
// dnnl_sgemm from 768 rows on at K = 15360). So f32 linears of 1024 rows and more stay on
// dnnl_sgemm (kernels/gemm.h) in every mode, unpacked.
//
// bf16 (x and w bf16; the bias none, f32 or bf16; y f32 or bf16): every multi-row linear runs
// here, reading the bf16 operands as they are (no f32 copy of the weight), accumulating in f32
// and rounding once into y's dtype. One of two ways, fixed for the process (Bf16LinearPath), so
// again every mode gets the same bits. KILN_GEMM does not apply (OpenBLAS is f32 only here).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

constexpr int64_t kPrimitiveMaxRows = 1024;
// Whether an f32 linear of `rows` rows runs here: more than one row (single rows run on the
// GEMV, gemv.h), fewer than kPrimitiveMaxRows, and the oneDNN backend (KILN_GEMM=openblas sends
// every multi-row f32 linear to OpenBLAS).
bool linear_runs_on_primitive(int64_t rows);

// How bf16 linears of 2+ rows compute.
//  amx:      kiln's own AMX tile kernel (amx_gemm.h): bf16 dot products summed in f32, the weight
//            packed a chunk at a time inside the call (never pre-packed).
//  dot:      oneDNN's bf16 matmul primitive: bf16 dot products summed in f32 (AVX512_BF16 or
//            AMX instructions). Reads its weight pre-packed in compiled mode, as f32 does.
//  widened:  x widened to f32 (exact), the weight widened a panel of rows at a time straight
//            into the f32 primitive's blocked layout (a panel is at most ~16 MiB of f32, never
//            the whole weight), then the f32 primitive: the f32 kernel's speed less the widening
//            passes, on the f32 products of the same bf16 values.
// bf16 dot products win only where the CPU runs them faster than f32 FMAs: AMX, and AMD's
// AVX512_BF16 (Zen 4 and later, by their instruction tables). A Xeon with AVX512_BF16 but without
// AMX (or with AMX hidden, as in a VM) was measured issuing VDPBF16PS at a quarter of VFMADD's
// rate, half its FLOPs: there oneDNN's bf16 primitive ran at ~0.55x its f32 one and the widened
// path at 0.75-1.0x (bench/bench_linear, FLUX.1 shapes). CPUs without AVX512_BF16 would emulate the dot products.
// Where AMX is usable the amx path runs (bench/bench_linear: faster than oneDNN's AMX primitive
// at every FLUX.1 and T5 shape measured), elsewhere dot where bf16 dot products are fast, else
// widened. On the amx path linears of fewer than kAmxMinRows rows (CLIP's 77 tokens) run as on the
// dot path, reading the plain weight: packing a weight inside the call costs about as much as a
// product that short.
enum class Bf16LinearPath { amx, dot, widened };
constexpr int64_t kAmxMinRows = 128;
// The path of this process: env KILN_BF16_LINEAR=amx|dot|widened where set (amx must be usable),
// else chosen from the CPU on first use (above); then fixed.
Bf16LinearPath bf16_linear_path();
// Whether this oneDNN has a bf16 matmul for this CPU (AVX-512 and up: native with AVX512_BF16,
// emulated without): where not, the dot path fails and only the widened path runs.
bool bf16_dot_path_available();
const char* bf16_linear_path_name(Bf16LinearPath p);

// Whether a linear of `rows` rows with x and weight of these dtypes reads its weight through a
// primitive that can read it pre-packed: f32 weights where linear_runs_on_primitive (whatever x
// is), bf16 ones with bf16 x on the dot path (not on amx, which packs inside the call). Compiled
// mode pre-packs the weights of exactly these (prepacked_weights.h).
bool linear_reads_packed_weight(int64_t rows, DType x, DType w);

// A linear weight [N,K] in the primitive's blocked layout, in the weight's dtype. Immutable;
// shareable across threads.
class PackedLinearWeight;

// Whether a packed [N,K] weight of dtype w (f32 or bf16) gives the linear the bits of the plain
// one: the primitive reading it packed must be the same implementation as the one reading it
// plain (on AVX-512 both are brgemm, which only copies the plain weight into that layout inside
// the call). False where oneDNN picks different kernels for the two (then nothing should be
// packed).
bool linear_packing_keeps_bits(int64_t N, int64_t K, DType w = DType::f32);
// Bytes of a packed [N,K] weight. The primitive's packed layout depends only on N, K and the
// dtype (on this oneDNN, for every row count), so one packed copy serves every M; the linear
// checks it anyway.
size_t packed_linear_weight_bytes(int64_t N, int64_t K, DType w = DType::f32);
// Packs w [N,K] (dense, of dtype w_type: f32 or bf16) into `storage`
// (packed_linear_weight_bytes(N, K, w_type) bytes, 64-byte aligned), which `owner` keeps alive
// for as long as the packed weight lives.
std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const void* w, DType w_type, int64_t N, int64_t K,
                                                             void* storage, std::shared_ptr<void> owner);
std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K, void* storage,
                                                             std::shared_ptr<void> owner);
// As above, into host memory the packed weight owns (tests, benchmarks).
std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const void* w, DType w_type, int64_t N, int64_t K);
std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K);

// y[M,N] = x[M,K] · w[N,K]ᵀ + bias. x, w dense row-major; bias [N] or nullptr; y dense [M,N],
// not overlapping the inputs. `packed`, when given, must hold w's values (it is used when its
// layout is the one this M's primitive reads and that primitive is the plain one's
// implementation, else w is read). Callable from any thread.
void linear_f32(const float* x, const float* w, const PackedLinearWeight* packed, const float* bias, float* y,
                int64_t M, int64_t N, int64_t K);

// As linear_f32 for bf16 x and w; bias of bias_type (f32 or bf16) or nullptr; y of y_type (f32
// or bf16): the f32 sum plus the bias, rounded once when y is bf16. `packed` (a bf16 pack) is
// read only on the dot path, under linear_f32's rule. `path`: the process's unless given (tests
// and benchmarks run each).
void linear_bf16(const void* x, const void* w, const PackedLinearWeight* packed, const void* bias, DType bias_type,
                 void* y, DType y_type, int64_t M, int64_t N, int64_t K, Bf16LinearPath path = bf16_linear_path());

// y = x · dequant(w)ᵀ + bias for a weight held in a storage type (fp8 or ggml blocks,
// core/quant_blocks.h), x f32 or bf16, bias none/f32/bf16, y f32 or bf16. The weight is
// dequantized a panel of rows at a time (up to ~16M elements, never the whole weight) into
// the GEMM's operand type, which the plain primitive then reads: bf16 panels for bf16 x where
// bf16 dot products are fast (the amx and dot paths: bf16 dot products summed in f32; each weight
// value rounded once to bf16), f32 panels otherwise. No copy of the whole weight is made, and the bits do not depend on the mode.
void linear_quantized(const void* x, DType x_type, const void* w, DType w_type, const void* bias, DType bias_type,
                      void* y, DType y_type, int64_t M, int64_t N, int64_t K);

// How many linear calls read a packed weight, how many packed w inside the call (f32, and bf16 on
// the dot path), how many bf16 ones ran on the widened path, how many on the AMX kernel, and how
// many read a quantized weight panel by panel.
struct LinearGemmCounts {
  int64_t prepacked = 0, packed_in_call = 0, widened = 0, amx = 0, dequantized = 0;
};
LinearGemmCounts linear_gemm_counts();

// Builds one tiny primitive so oneDNN's global state exists before the CPU runtime registers
// its exit drain (see gemm_warm_up).
void linear_gemm_warm_up();

}  // namespace kiln::cpu::KILN_CPU_LEVEL
