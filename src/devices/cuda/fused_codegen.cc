#include "devices/cuda/fused_codegen.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "core/error.h"

namespace kiln::cuda {

// Conversions as the CPU's (core/dtype.h): bf16 rounds to nearest even and keeps NaN quiet; f16
// through the hardware's round-to-nearest-even conversion; integers truncate toward zero.
const char* const kKernelPrelude = R"(struct KilnDims { long long d[8]; };
__device__ __forceinline__ float kiln_bf16_load(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short kiln_bf16_store(float f) {
  unsigned bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (unsigned short)(bits >> 16);
}
__device__ __forceinline__ float kiln_f16_load(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ unsigned short kiln_f16_store(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float kiln_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float kiln_ld(const void* p, int t, long long i) {
  switch (t) {
    case 0: return ((const float*)p)[i];
    case 1: return kiln_bf16_load(((const unsigned short*)p)[i]);
    case 2: return kiln_f16_load(((const unsigned short*)p)[i]);
    case 3: return (float)((const int*)p)[i];
    case 4: return (float)((const long long*)p)[i];
    default: return ((const unsigned char*)p)[i] ? 1.0f : 0.0f;
  }
}
__device__ __forceinline__ void kiln_st(void* p, int t, long long i, float v) {
  switch (t) {
    case 0: ((float*)p)[i] = v; break;
    case 1: ((unsigned short*)p)[i] = kiln_bf16_store(v); break;
    case 2: ((unsigned short*)p)[i] = kiln_f16_store(v); break;
    case 3: ((int*)p)[i] = (int)v; break;
    case 4: ((long long*)p)[i] = (long long)v; break;
    default: ((unsigned char*)p)[i] = v != 0.0f; break;
  }
}
)";

namespace {

using Kind = FusedInstr::Kind;

// The C type a dtype is stored as, and how an element at offset `o` of pointer `p` loads as f32.
const char* storage_type(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::bf16:
    case DType::f16: return "unsigned short";
    case DType::i32: return "int";
    case DType::i64: return "long long";
    case DType::boolean: return "unsigned char";
    default: fail("fused", "the CUDA code generator has no ", dtype_name(t), " loads or stores");
  }
}

std::string load_expr(DType t, const std::string& elem) {
  switch (t) {
    case DType::f32: return elem;
    case DType::bf16: return "kiln_bf16_load(" + elem + ")";
    case DType::f16: return "kiln_f16_load(" + elem + ")";
    case DType::i32:
    case DType::i64: return "(float)(" + elem + ")";
    case DType::boolean: return "((" + elem + ") ? 1.0f : 0.0f)";
    default: storage_type(t);
  }
  return {};
}

// The stored form of f32 value `v` in dtype `t`.
std::string store_expr(DType t, const std::string& v) {
  switch (t) {
    case DType::f32: return v;
    case DType::bf16: return "kiln_bf16_store(" + v + ")";
    case DType::f16: return "kiln_f16_store(" + v + ")";
    case DType::i32: return "(int)(" + v + ")";
    case DType::i64: return "(long long)(" + v + ")";
    case DType::boolean: return "(unsigned char)((" + v + ") != 0.0f)";
    default: storage_type(t);
  }
  return {};
}

// An exact literal: hexadecimal floating point, or the bits of an infinity or NaN.
std::string float_literal(float f) {
  if (std::isnan(f)) return "__int_as_float(0x7fc00000)";
  if (std::isinf(f)) return f > 0 ? "__int_as_float(0x7f800000)" : "__int_as_float(0xff800000)";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%af", double(f));
  return buf;
}
std::string double_literal(double d) {
  KILN_CHECK(std::isfinite(d), "fused", "an iota with a non-finite start or step (", d, ")");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", d);
  return buf;
}

std::string reg(int r) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "r%d", r);
  return buf;
}

std::string unary_expr(const FusedInstr& in) {
  const std::string a = reg(in.a);
  switch (in.unary) {
    case UnaryOp::neg: return "-" + a;
    case UnaryOp::abs: return "fabsf(" + a + ")";
    case UnaryOp::exp: return "expf(" + a + ")";
    case UnaryOp::log: return "logf(" + a + ")";
    case UnaryOp::sqrt: return "sqrtf(" + a + ")";
    case UnaryOp::rsqrt: return "1.0f / sqrtf(" + a + ")";
    case UnaryOp::tanh: return "tanhf(" + a + ")";
    case UnaryOp::sin: return "sinf(" + a + ")";
    case UnaryOp::cos: return "cosf(" + a + ")";
    case UnaryOp::sigmoid: return "kiln_sigmoid(" + a + ")";
    case UnaryOp::relu: return "fmaxf(" + a + ", 0.0f)";
    case UnaryOp::silu: return a + " * kiln_sigmoid(" + a + ")";
    case UnaryOp::gelu: return "0.5f * " + a + " * (1.0f + erff(" + a + " * 0.70710678118654752f))";
    case UnaryOp::gelu_tanh:
      return "0.5f * " + a + " * (1.0f + tanhf(0.7978845608028654f * fmaf(0.044715f * (" + a + " * " + a + "), " + a +
             ", " + a + ")))";
    case UnaryOp::quick_gelu: return a + " * kiln_sigmoid(1.702f * " + a + ")";
    case UnaryOp::clamp: return "fminf(fmaxf(" + a + ", " + float_literal(in.lo) + "), " + float_literal(in.hi) + ")";
  }
  fail("fused", "unknown unary op ", int(in.unary));
}

std::string binary_expr(const FusedInstr& in) {
  const std::string a = reg(in.a), b = reg(in.b);
  const auto cmp = [&](const char* op) { return "(" + a + " " + op + " " + b + " ? 1.0f : 0.0f)"; };
  switch (in.binary) {
    case BinaryOp::add: return a + " + " + b;
    case BinaryOp::sub: return a + " - " + b;
    case BinaryOp::mul: return a + " * " + b;
    case BinaryOp::div: return a + " / " + b;
    case BinaryOp::pow: return "powf(" + a + ", " + b + ")";
    case BinaryOp::maximum: return "fmaxf(" + a + ", " + b + ")";
    case BinaryOp::minimum: return "fminf(" + a + ", " + b + ")";
    case BinaryOp::eq: return cmp("==");
    case BinaryOp::ne: return cmp("!=");
    case BinaryOp::lt: return cmp("<");
    case BinaryOp::le: return cmp("<=");
    case BinaryOp::gt: return cmp(">");
    case BinaryOp::ge: return cmp(">=");
  }
  fail("fused", "unknown binary op ", int(in.binary));
}

// Names the kernel by a hash of its text, so equal programs share one compiled kernel.
KernelSource named(const std::string& prefix, const std::string& body_with_placeholder) {
  KernelSource k;
  k.name = prefix + text_hash(body_with_placeholder);
  k.source = body_with_placeholder;
  const std::string placeholder = "KILN_KERNEL_NAME";
  k.source.replace(k.source.find(placeholder), placeholder.size(), k.name);
  return k;
}

// The kernel's signature and the loop splitting element i into per-input offsets o<k> and the
// index along the last dim (`last`, for iotas).
std::string loop_head(size_t num_inputs) {
  std::ostringstream os;
  os << "extern \"C\" __global__ void KILN_KERNEL_NAME(const long long n, const KilnDims shape, const int rank, "
        "void* __restrict__ out";
  for (size_t k = 0; k < num_inputs; ++k) os << ", const void* __restrict__ in" << k << ", const KilnDims st" << k;
  os << ") {\n"
        "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;"
        " i += (long long)gridDim.x * blockDim.x) {\n"
        "    long long rem = i, last = 0;\n";
  for (size_t k = 0; k < num_inputs; ++k) os << "    long long o" << k << " = 0;\n";
  os << "    for (int d = rank - 1; d >= 0; --d) {\n"
        "      const long long c = rem % shape.d[d];\n"
        "      rem /= shape.d[d];\n"
        "      if (d == rank - 1) last = c;\n";
  for (size_t k = 0; k < num_inputs; ++k) os << "      o" << k << " += c * st" << k << ".d[d];\n";
  os << "    }\n";
  return os.str();
}

}  // namespace

std::string text_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, h);
  return hex;
}

bool codegen_supports(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16 || t == DType::i32 || t == DType::i64 ||
         t == DType::boolean;
}

KernelSource fused_kernel_source(const FusedProgram& program, const std::vector<DType>& inputs, DType out) {
  validate_fused_program(program, inputs.size());
  for (DType t : inputs) KILN_CHECK(codegen_supports(t), "fused", "the CUDA code generator cannot load ", dtype_name(t));
  KILN_CHECK(codegen_supports(out), "fused", "the CUDA code generator cannot store ", dtype_name(out));
  std::ostringstream os;
  os << kKernelPrelude << loop_head(inputs.size());
  for (int i : live_instructions(program)) {  // what the CPU interpreter evaluates, too
    const FusedInstr& in = program.instrs[size_t(i)];
    os << "    const float " << reg(i) << " = ";
    switch (in.kind) {
      case Kind::load: {
        const DType t = inputs[size_t(in.input)];
        const std::string elem = std::string("((const ") + storage_type(t) + "*)in" + std::to_string(in.input) +
                                 ")[o" + std::to_string(in.input) + "]";
        os << load_expr(t, elem);
        break;
      }
      case Kind::iota:
        // Element j of the [count] vector, broadcast along the last dim: float(start + j * step),
        // computed in double as the arange kernel does.
        os << "(float)(" << double_literal(in.start) << " + (double)(" << (in.count == 1 ? "0" : "last") << ") * "
           << double_literal(in.step) << ")";
        break;
      case Kind::unary: os << unary_expr(in); break;
      case Kind::binary: os << binary_expr(in); break;
      case Kind::where: os << "(" << reg(in.a) << " != 0.0f) ? " << reg(in.b) << " : " << reg(in.c); break;
      case Kind::round: {
        const std::string stored = store_expr(in.dtype, reg(in.a));
        const std::string as_type = std::string("(") + storage_type(in.dtype) + ")(" + stored + ")";
        os << (in.dtype == DType::f32 ? reg(in.a) : load_expr(in.dtype, as_type));
        break;
      }
    }
    os << ";\n";
  }
  os << "    ((" << storage_type(out) << "*)out)[i] = " << store_expr(out, reg(program.result)) << ";\n  }\n}\n";
  return named("kiln_fused_", os.str());
}

KernelSource strided_copy_source(size_t element_bytes) {
  const char* type = element_bytes == 1   ? "unsigned char"
                     : element_bytes == 2 ? "unsigned short"
                     : element_bytes == 4 ? "unsigned int"
                     : element_bytes == 8 ? "unsigned long long"
                                          : nullptr;
  KILN_CHECK(type != nullptr, "copy", "no strided copy of ", element_bytes, "-byte elements");
  std::ostringstream os;
  os << kKernelPrelude << loop_head(1) << "    ((" << type << "*)out)[i] = ((const " << type << "*)in0)[o0];\n  }\n}\n";
  return named("kiln_copy_", os.str());
}

KernelSource integer_cast_source(DType from, DType to) {
  for (DType t : {from, to})
    KILN_CHECK(t == DType::i32 || t == DType::i64 || t == DType::boolean, "cast", "not an integer dtype: ", dtype_name(t));
  const std::string elem = std::string("((const ") + storage_type(from) + "*)in0)[o0]";
  const std::string v = from == DType::boolean ? "(long long)(" + elem + " != 0)" : "(long long)" + elem;
  const std::string stored = to == DType::boolean ? "(unsigned char)(" + v + " != 0)" : std::string("(") + storage_type(to) + ")" + v;
  std::ostringstream os;
  os << kKernelPrelude << loop_head(1) << "    ((" << storage_type(to) << "*)out)[i] = " << stored << ";\n  }\n}\n";
  return named("kiln_cast_", os.str());
}

}  // namespace kiln::cuda
