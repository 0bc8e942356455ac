// linear and matmul on cuBLASLt. kiln's tensors are row-major and cuBLASLt's matrices
// column-major, so a row-major product Y[M,N] = X[M,K] · Wᵀ is computed as the column-major
// Yᵀ[N,M] = W[K,N]ᵀ-op · Xᵀ: A = the weight (transposed), B = the input, no copies. The bias of a
// linear is cuBLASLt's bias epilogue (one value per output feature, a row of Yᵀ). Accumulation is
// f32 in every dtype (CUBLAS_COMPUTE_32F: no TF32), so f32 stays within the CPU's rounding.
#include <cublasLt.h>

#include <memory>

#include "core/error.h"
#include "devices/cuda/check.h"
#include "devices/cuda/kernels/kernel_table.h"
#include "devices/cuda/launch.h"
#include "devices/cuda/libraries.h"

namespace kiln::cuda {

namespace {

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: fail("cublas", "no GEMM in ", dtype_name(t));
  }
}

// Owns a cuBLASLt descriptor; `destroy` is its library function.
template <typename T>
struct LtHandle {
  T h = nullptr;
  cublasStatus_t (*destroy)(T) = nullptr;
  ~LtHandle() {
    if (h) destroy(h);
  }
};
using Desc = LtHandle<cublasLtMatmulDesc_t>;
using Layout = LtHandle<cublasLtMatrixLayout_t>;
using Preference = LtHandle<cublasLtMatmulPreference_t>;

// One column-major product C[m,n] = op(A)[m,k] · op(B)[k,n] (+ bias[m]), `batch` times at the
// given element strides between matrices (0: the same matrix for every batch).
struct Gemm {
  DType dtype;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;
};

// Dense as Tensor::is_contiguous() says: a size-1 dim may carry any stride.
bool dense(const TensorView& v) {
  int64_t expected = 1;
  for (size_t d = v.shape.size(); d-- > 0;) {
    if (v.shape[d] != 1 && v.strides[d] != expected) return false;
    expected *= v.shape[d];
  }
  return true;
}

// The largest power of two (up to 256) dividing the address: what cuBLASLt may assume of it.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

void set_layout(Layout& l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  const CublasLtLibrary& lt = cublaslt();
  l.destroy = lt.MatrixLayoutDestroy;
  KILN_CUBLAS_CHECK(lt.MatrixLayoutCreate(&l.h, t, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    KILN_CUBLAS_CHECK(lt.MatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    KILN_CUBLAS_CHECK(
        lt.MatrixLayoutSetAttribute(l.h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
}

void run(const Gemm& g) {
  const LaunchContext& ctx = launch_context();
  const cudaDataType_t t = data_type(g.dtype);
  const CublasLtLibrary& lt = cublaslt();
  Desc desc{nullptr, lt.MatmulDescDestroy};
  KILN_CUBLAS_CHECK(lt.MatmulDescCreate(&desc.h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(lt.MatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  KILN_CUBLAS_CHECK(lt.MatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (g.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    KILN_CUBLAS_CHECK(lt.MatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    KILN_CUBLAS_CHECK(lt.MatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
    KILN_CUBLAS_CHECK(lt.MatmulDescSetAttribute(desc.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
  }
  Layout la, lb, lc;
  set_layout(la, t, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda, g.batch, g.stride_a);
  set_layout(lb, t, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb, g.batch, g.stride_b);
  set_layout(lc, t, g.m, g.n, g.ldc, g.batch, g.stride_c);
  Preference pref{nullptr, lt.MatmulPreferenceDestroy};
  KILN_CUBLAS_CHECK(lt.MatmulPreferenceCreate(&pref.h));
  KILN_CUBLAS_CHECK(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                          &ctx.workspace_bytes, sizeof ctx.workspace_bytes));
  // Operands are views at element offsets (slices, rows written into a concat's buffer): the
  // algorithm may assume only the alignment their addresses have (cuBLASLt's default is 256).
  const size_t es = dtype_size(g.dtype);
  const auto batch_alignment = [&](const void* p, int64_t stride) {
    const uint32_t a = alignment(p);
    return g.batch > 1 && stride != 0 ? std::min(a, alignment(reinterpret_cast<const void*>(uintptr_t(stride) * es))) : a;
  };
  const uint32_t align_a = batch_alignment(g.a, g.stride_a);
  const uint32_t align_b = batch_alignment(g.b, g.stride_b);
  const uint32_t align_c = std::min(batch_alignment(g.c, g.stride_c), g.bias ? alignment(g.bias) : 256u);
  KILN_CUBLAS_CHECK(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
  KILN_CUBLAS_CHECK(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
  KILN_CUBLAS_CHECK(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
  KILN_CUBLAS_CHECK(lt.MatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  KILN_CUBLAS_CHECK(
      lt.MatmulAlgoGetHeuristic(ctx.lt, desc.h, la.h, lb.h, lc.h, lc.h, pref.h, 1, &heuristic, &found));
  KILN_CHECK(found > 0, "cublas", "no GEMM algorithm for ", dtype_name(g.dtype), " m=", g.m, " n=", g.n, " k=", g.k);
  const float one = 1.0f, zero = 0.0f;
  KILN_CUBLAS_CHECK(lt.Matmul(ctx.lt, desc.h, &one, g.a, la.h, g.b, lb.h, &zero, g.c, lc.h, g.c, lc.h,
                                   &heuristic.algo, ctx.workspace, ctx.workspace_bytes, ctx.stream));
}


// A product over K = 0 terms: the bias broadcast over the rows, or zeros (as on the CPU).
void empty_product(const TensorView& out, const TensorView* bias) {
  FusedProgram p;
  FusedInstr first;
  first.kind = FusedInstr::Kind::load;
  first.input = 0;
  p.instrs.push_back(first);
  p.result = 0;
  if (bias) {
    launch_fused(p, {*bias}, out);
    return;
  }
  TensorView zero;  // one f32 zero, broadcast
  static const float kZero = 0.0f;
  zero.data = const_cast<float*>(&kZero);
  zero.dtype = DType::f32;
  launch_fused(p, {zero}, out);
}

// linear: x [..., K] · w[N, K]ᵀ (+ bias[N]) -> [..., N].
void linear_kernel(const KernelArgs& args) {
  const TensorView &x = args.in[0], &w = args.in[1];
  KILN_CHECK(dense(x) && dense(w) && dense(args.out), "linear", "the CUDA linear reads dense operands");
  Gemm g;
  g.dtype = x.dtype;
  g.k = w.shape[1];
  g.m = w.shape[0];                            // output features: rows of Yᵀ
  g.n = g.k == 0 ? 0 : x.numel() / g.k;        // rows of x: columns of Yᵀ
  g.trans_a = true;                            // W stored [N, K] row-major = [K, N] column-major
  g.lda = g.k;
  g.ldb = g.k;
  g.ldc = g.m;
  g.a = w.data;
  g.b = x.data;
  g.c = args.out.data;
  if (args.in.size() > 2) g.bias = args.in[2].data;
  if (g.k == 0) return empty_product(args.out, args.in.size() > 2 ? &args.in[2] : nullptr);
  if (g.n > 0 && g.m > 0) run(g);
}

// matmul: a [..., M, K] · b [..., K, N] (either transposed by attrs), batch dims broadcast:
// Cᵀ = Bᵀ · Aᵀ in column-major terms, batched by strides (0 for a broadcast operand).
void matmul_kernel(const KernelArgs& args) {
  const TensorView &a = args.in[0], &b = args.in[1], &c = args.out;
  KILN_CHECK(dense(a) && dense(b), "matmul", "the CUDA matmul reads dense operands");
  const bool ta = args.attrs->get_int("transpose_a", 0), tb = args.attrs->get_int("transpose_b", 0);
  const int64_t ra = a.rank(), rc = c.rank();
  const int64_t m = c.shape[size_t(rc - 2)], n = c.shape[size_t(rc - 1)];
  const int64_t k = ta ? a.shape[size_t(ra - 2)] : a.shape[size_t(ra - 1)];
  const int64_t batch = c.numel() / std::max<int64_t>(m * n, 1);
  const int64_t batch_a = a.numel() / std::max<int64_t>(m * k, 1), batch_b = b.numel() / std::max<int64_t>(k * n, 1);
  // Only all-or-nothing batch broadcasts are strides; a partial one would need per-dim strides.
  KILN_CHECK((batch_a == batch || batch_a == 1) && (batch_b == batch || batch_b == 1), "matmul",
             "the CUDA matmul broadcasts a whole batch only: ", to_string(a.shape), " x ", to_string(b.shape));
  Gemm g;
  g.dtype = a.dtype;
  g.m = n;  // Cᵀ[n, m]
  g.n = m;
  g.k = k;
  g.a = b.data;  // Bᵀ: b row-major [K, N] is column-major [N, K]
  g.trans_a = tb;
  g.lda = tb ? k : n;
  g.b = a.data;
  g.trans_b = ta;
  g.ldb = ta ? m : k;
  g.c = c.data;
  g.ldc = n;
  g.batch = batch;
  g.stride_a = batch_b == 1 ? 0 : k * n;
  g.stride_b = batch_a == 1 ? 0 : m * k;
  g.stride_c = m * n;
  if (k == 0) return empty_product(c, nullptr);
  if (m > 0 && n > 0 && batch > 0) run(g);
}

// The batch dims of a and b broadcast whole (all equal, or one side's all 1): strides express it.
bool whole_batch_broadcast(const std::vector<OperandMeta>& in) {
  const Shape &a = in[0].shape, &b = in[1].shape;
  if (a.size() < 2 || b.size() < 2) return false;
  const int64_t ba = numel(Shape(a.begin(), a.end() - 2)), bb = numel(Shape(b.begin(), b.end() - 2));
  if (ba == 1 || bb == 1) return true;
  const size_t ra = a.size() - 2, rb = b.size() - 2, r = std::max(ra, rb);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - ra ? 1 : a[i - (r - ra)], db = i < r - rb ? 1 : b[i - (r - rb)];
    if (da != db) return false;
  }
  return true;
}

bool same_gemm_dtype(const std::vector<OperandMeta>& in) {
  const DType t = in[0].dtype;
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16) return false;
  for (const OperandMeta& m : in)
    if (m.dtype != t) return false;
  return true;
}

}  // namespace

void add_contraction_kernels(KernelTable& table) {
  table["linear"] = {&linear_kernel, same_gemm_dtype};
  table["matmul"] = {&matmul_kernel, [](const std::vector<OperandMeta>& in) {
                       return same_gemm_dtype(in) && whole_batch_broadcast(in);
                     }};
}

}  // namespace kiln::cuda
