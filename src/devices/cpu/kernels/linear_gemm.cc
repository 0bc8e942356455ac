#include "devices/cpu/kernels/linear_gemm.h"

#include <algorithm>
#include <atomic>
#include <compare>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "core/env.h"
#include "devices/cpu/kernels/amx_gemm.h"
#include "devices/cpu/kernels/call_scratch.h"
#include "devices/cpu/kernels/dequantize.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/onednn.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

using dnnl::memory;
using tag = memory::format_tag;

class PackedLinearWeight {
 public:
  PackedLinearWeight(const memory::desc& desc, void* storage, std::shared_ptr<void> owner)
      : mem(desc, onednn::engine(), storage), owner_(std::move(owner)) {}
  memory mem;

 private:
  std::shared_ptr<void> owner_;  // keeps mem's bytes
};

namespace {

constexpr const char* kOp = "linear";

std::atomic<int64_t> g_prepacked{0}, g_packed_in_call{0}, g_widened{0}, g_amx{0}, g_dequantized{0};

struct PlanKey {
  int64_t M, N, K;
  DType xw = DType::f32;    // x and w
  bool bias = false;
  DType bias_type = DType::f32;  // f32 when there is no bias
  DType y = DType::f32;
  bool packed = false;  // the primitive reads weights in its own (blocked) layout
  auto operator<=>(const PlanKey&) const = default;
};

struct LinearPlan {
  memory::desc x, w_plain, bias, y;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

std::shared_ptr<const LinearPlan> build_plan(const PlanKey& k) {
  const memory::data_type xw = onednn::data_type(k.xw);
  auto p = std::make_shared<LinearPlan>();
  p->x = memory::desc({k.M, k.K}, xw, tag::ab);
  p->w_plain = memory::desc({k.K, k.N}, xw, tag::ba);  // [K,N] logical, stored as [N,K] rows
  p->bias = k.bias ? memory::desc({1, k.N}, onednn::data_type(k.bias_type), tag::ab) : memory::desc();
  p->y = memory::desc({k.M, k.N}, onednn::data_type(k.y), tag::ab);
  const memory::desc w = k.packed ? memory::desc({k.K, k.N}, xw, tag::any) : p->w_plain;
  p->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(p->x, w, p->bias, p->y), onednn::user_scratchpad_attr(),
                                       onednn::engine());
  p->prim = dnnl::matmul(p->pd);
  return p;
}

std::shared_ptr<const LinearPlan> get_plan(const PlanKey& key) {
  static std::mutex* mu = new std::mutex;
  // Never destroyed: at exit the device queue may still be running a linear.
  static auto* cache = new std::map<PlanKey, std::shared_ptr<const LinearPlan>>;
  std::lock_guard<std::mutex> lock(*mu);
  auto it = cache->find(key);
  if (it == cache->end()) it = cache->emplace(key, build_plan(key)).first;
  return it->second;
}

bool same_kernel(const LinearPlan& plain, const LinearPlan& packed) {
  const std::string a = plain.pd.impl_info_str(), b = packed.pd.impl_info_str();
  return a == b && a.rfind("brg", 0) == 0;
}

template <class F>
auto onednn_call(F&& f) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    fail(kOp, "oneDNN error (status ", static_cast<int>(e.status), "): ", e.what());
  }
}

// The plain and packed plans a weight's packing is judged and made with: a reference row count
// (see the header), no bias, y in the weight's dtype.
PlanKey reference_key(int64_t N, int64_t K, DType w, bool packed) {
  return {64, N, K, w, false, DType::f32, w, packed};
}

// The packed layout of [N,K].
memory::desc packed_desc(int64_t N, int64_t K, DType w) {
  return get_plan(reference_key(N, K, w, true))->pd.weights_desc();
}

void check_weight_type(DType w) {
  KILN_CHECK(f32_or_bf16(w), kOp, "packed linear weights are f32 or bf16, not ", dtype_name(w));
}

// Runs `plan` on x, w (or `packed`'s memory), bias, y.
void execute(const LinearPlan& plan, const void* x, const void* w, const PackedLinearWeight* packed, const void* bias,
             void* y) {
  const dnnl::engine& eng = onednn::engine();
  // oneDNN takes non-const handles but only reads inputs.
  onednn::Args args{{DNNL_ARG_SRC, memory(plan.x, eng, const_cast<void*>(x))},
                    {DNNL_ARG_WEIGHTS, packed ? packed->mem : memory(plan.w_plain, eng, const_cast<void*>(w))},
                    {DNNL_ARG_DST, memory(plan.y, eng, y)}};
  if (bias) args.emplace(DNNL_ARG_BIAS, memory(plan.bias, eng, const_cast<void*>(bias)));
  onednn::add_scratchpad(args, plan.pd.scratchpad_desc());
  dnnl::stream& stream = onednn::thread_stream();
  plan.prim.execute(stream, args);
  stream.wait();
}

// The plain plan for `key`, or its packed twin when `packed` holds the layout that twin reads
// and the twin is the plain plan's implementation (the same bits); `use_packed` says which.
std::shared_ptr<const LinearPlan> plan_for(PlanKey key, const PackedLinearWeight* packed, bool& use_packed) {
  std::shared_ptr<const LinearPlan> plan = get_plan(key);
  use_packed = false;
  if (packed) {
    key.packed = true;
    auto packed_plan = get_plan(key);
    if (packed->mem.get_desc() == packed_plan->pd.weights_desc() && same_kernel(*plan, *packed_plan)) {
      plan = std::move(packed_plan);
      use_packed = true;
    }
  }
  (use_packed ? g_prepacked : g_packed_in_call).fetch_add(1, std::memory_order_relaxed);
  return plan;
}

// Widens n bf16 values to f32 (exact), over the threads when there are many.
void widen_bf16(const void* src, float* dst, int64_t n) {
  constexpr int64_t kChunk = int64_t(1) << 16;
  const auto* s = static_cast<const uint16_t*>(src);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i = c * kChunk;
    convert_to_f32(s + i, DType::bf16, dst + i, std::min(kChunk, n - i));
  }
}

// Columns [j, j + n) of y [M, ldy] (f32 or bf16) from a dense f32 panel [M, n].
void store_panel(const float* panel, int64_t M, int64_t n, void* y, DType y_type, int64_t ldy, int64_t j) {
#pragma omp parallel for schedule(static) if (M * n >= (int64_t(1) << 16))
  for (int64_t i = 0; i < M; ++i) {
    const float* src = panel + i * n;
    if (y_type == DType::bf16) {
      convert_from_f32(src, static_cast<uint16_t*>(y) + i * ldy + j, DType::bf16, n);
    } else {
      std::memcpy(static_cast<float*>(y) + i * ldy + j, src, size_t(n) * sizeof(float));
    }
  }
}

// Weight rows per widened panel: at most ~16 MiB of f32 whatever K is, so the f32 copy in
// flight stays small next to the weight; N split into panels of equal width (a multiple of 64, the
// kernels' column block), since a narrow last panel runs slower per column.
int64_t panel_rows(int64_t N, int64_t K) {
  constexpr int64_t kPanelElems = int64_t(4) << 20;
  const int64_t most = std::max<int64_t>(64, kPanelElems / K / 64 * 64);
  const int64_t panels = (N + most - 1) / most;
  return std::min(N, ((N + panels - 1) / panels + 63) / 64 * 64);
}

// The widened path (see the header): the f32 primitive reading each panel of w widened straight
// into its packed layout by one oneDNN reorder.
void linear_bf16_widened(const void* x, const void* w, const void* bias, DType bias_type, void* y, DType y_type,
                         int64_t M, int64_t N, int64_t K) {
  g_widened.fetch_add(1, std::memory_order_relaxed);
  const CallScratch xf(kOp, size_t(M * K) * sizeof(float));
  widen_bf16(x, xf.as<float>(), M * K);
  std::vector<float> bf;
  const float* b = static_cast<const float*>(bias);
  if (bias && bias_type == DType::bf16) {
    bf.resize(size_t(N));
    convert_to_f32(bias, DType::bf16, bf.data(), N);
    b = bf.data();
  }
  const int64_t rows = panel_rows(N, K);
  // y itself takes the product when it is f32 and one panel covers it; else a panel buffer.
  const bool direct = y_type == DType::f32 && rows == N;
  const CallScratch out(kOp, direct ? 0 : size_t(M * rows) * sizeof(float));
  // The widest panel's packed layout is the largest (the last panel may be narrower).
  const PlanKey key{M, rows, K, DType::f32, b != nullptr, DType::f32, DType::f32, true};
  const size_t widest = get_plan(key)->pd.weights_desc().get_size();
  const CallScratch panel_bytes(kOp, widest);
  const dnnl::engine& eng = onednn::engine();
  dnnl::stream& stream = onednn::thread_stream();
  for (int64_t j = 0; j < N; j += rows) {
    const int64_t n = std::min(rows, N - j);
    PlanKey panel_key = key;
    panel_key.N = n;
    const auto plan = get_plan(panel_key);
    KILN_CHECK(plan->pd.weights_desc().get_size() <= widest, kOp, "a narrower panel's packed weight is larger");
    memory panel(plan->pd.weights_desc(), eng, panel_bytes.as<void>());
    memory plain(memory::desc({K, n}, memory::data_type::bf16, tag::ba), eng,
                 const_cast<uint16_t*>(static_cast<const uint16_t*>(w) + j * K));
    dnnl::reorder(plain, panel).execute(stream, plain, panel);
    onednn::Args args{{DNNL_ARG_SRC, memory(plan->x, eng, xf.as<void>())},
                      {DNNL_ARG_WEIGHTS, panel},
                      {DNNL_ARG_DST, memory(plan->y, eng, direct ? y : out.as<void>())}};
    if (b) args.emplace(DNNL_ARG_BIAS, memory(plan->bias, eng, const_cast<float*>(b + j)));
    onednn::add_scratchpad(args, plan->pd.scratchpad_desc());
    plan->prim.execute(stream, args);
    stream.wait();
    if (!direct) store_panel(out.as<float>(), M, n, y, y_type, N, j);
  }
}

// Weight rows per dequantized panel: up to ~16M elements (32 MiB of bf16) and never the whole
// weight (at least two panels), of equal widths that are multiples of 64. Fewer, larger panels
// re-read x fewer times, which decides the speed at FLUX.1's large-K shapes
// (bench/bench_quantized_linear).
int64_t quantized_panel_rows(int64_t N, int64_t K) {
  constexpr int64_t kPanelElems = int64_t(16) << 20;
  if (N <= 64) return N;
  const int64_t most = std::max<int64_t>(64, std::min(kPanelElems / K, (N + 1) / 2) / 64 * 64);
  const int64_t panels = (N + most - 1) / most;
  return std::min(N, ((N + panels - 1) / panels + 63) / 64 * 64);
}

// The quantized path (see the header): each panel of w's rows dequantized into a plain panel
// of the compute type, then the plain primitive on it.
void linear_quantized_panels(const void* x, DType x_type, const void* w, DType w_type, const void* bias,
                             DType bias_type, void* y, DType y_type, int64_t M, int64_t N, int64_t K) {
  g_dequantized.fetch_add(1, std::memory_order_relaxed);
  // bf16 x multiplies bf16 panels where bf16 dot products are fast; else everything is f32.
  const bool bf16_dot = x_type == DType::bf16 && bf16_linear_path() != Bf16LinearPath::widened;
  const DType ct = bf16_dot ? DType::bf16 : DType::f32;
  const CallScratch xf(kOp, x_type == ct ? 0 : size_t(M * K) * sizeof(float));
  if (x_type != ct) {
    if (x_type == DType::bf16) {
      widen_bf16(x, xf.as<float>(), M * K);
    } else {
      convert_to_f32(x, x_type, xf.as<float>(), M * K);
    }
  }
  const void* xc = x_type == ct ? x : xf.as<void>();
  std::vector<float> bf;
  if (bias && ct == DType::f32 && bias_type != DType::f32) {
    bf.resize(size_t(N));
    convert_to_f32(bias, bias_type, bf.data(), N);
    bias = bf.data();
    bias_type = DType::f32;
  }
  const int64_t rows = quantized_panel_rows(N, K);
  const bool direct = y_type == DType::f32 && rows == N;
  const CallScratch out(kOp, direct ? 0 : size_t(M * rows) * sizeof(float));
  const size_t es = dtype_size(ct);
  const CallScratch panel(kOp, size_t(rows * K) * es);
  const size_t row_bytes = storage_bytes(w_type, K);
  for (int64_t j = 0; j < N; j += rows) {
    const int64_t n = std::min(rows, N - j);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < n; ++r) {
      const char* src = static_cast<const char*>(w) + size_t(j + r) * row_bytes;
      if (ct == DType::bf16) {
        dequantize_row_bf16(w_type, src, panel.as<uint16_t>() + r * K, K);
      } else {
        dequantize_row_f32(w_type, src, panel.as<float>() + r * K, K);
      }
    }
    const auto plan = get_plan({M, n, K, ct, bias != nullptr, bias_type, DType::f32, false});
    const void* b = bias ? static_cast<const char*>(bias) + size_t(j) * dtype_size(bias_type) : nullptr;
    execute(*plan, xc, panel.as<void>(), nullptr, b, direct ? y : out.as<void>());
    if (!direct) store_panel(out.as<float>(), M, n, y, y_type, N, j);
  }
}

}  // namespace

bool linear_runs_on_primitive(int64_t rows) {
  return rows > 1 && rows < kPrimitiveMaxRows && gemm_backend() == GemmBackend::onednn;
}

Bf16LinearPath bf16_linear_path() {
  static const Bf16LinearPath path = [] {
    if (const auto forced = env::choice("KILN_BF16_LINEAR")) {
      if (*forced == "amx") {
        KILN_CHECK(amx_bf16_usable(), "env", "KILN_BF16_LINEAR=amx: this CPU, build or OS does not run AMX tiles");
        return Bf16LinearPath::amx;
      }
      if (*forced == "dot") {
        KILN_CHECK(bf16_dot_path_available(), "env", "KILN_BF16_LINEAR=dot: oneDNN has no bf16 matmul for this CPU");
        return Bf16LinearPath::dot;
      }
      return Bf16LinearPath::widened;
    }
    if (amx_bf16_usable()) return Bf16LinearPath::amx;
    return onednn_call([] { return onednn::bf16_dot_products_fast() ? Bf16LinearPath::dot : Bf16LinearPath::widened; });
  }();
  return path;
}

bool bf16_dot_path_available() { return onednn::cpu_has(dnnl::cpu_isa::avx512_core); }

const char* bf16_linear_path_name(Bf16LinearPath p) {
  return p == Bf16LinearPath::amx ? "amx" : p == Bf16LinearPath::dot ? "dot" : "widened";
}

bool linear_reads_packed_weight(int64_t rows, DType x, DType w) {
  if (w == DType::f32) return linear_runs_on_primitive(rows);  // any x: linear_f32 reads it as f32
  return w == DType::bf16 && x == DType::bf16 && rows > 1 && bf16_linear_path() == Bf16LinearPath::dot;
}

bool linear_packing_keeps_bits(int64_t N, int64_t K, DType w) {
  KILN_CHECK(N > 0 && K > 0, kOp, "linear_packing_keeps_bits: bad weight [", N, ",", K, "]");
  check_weight_type(w);
  return onednn_call(
      [&] { return same_kernel(*get_plan(reference_key(N, K, w, false)), *get_plan(reference_key(N, K, w, true))); });
}

size_t packed_linear_weight_bytes(int64_t N, int64_t K, DType w) {
  KILN_CHECK(N > 0 && K > 0, kOp, "packed_linear_weight_bytes: bad weight [", N, ",", K, "]");
  check_weight_type(w);
  return onednn_call([&] { return packed_desc(N, K, w).get_size(); });
}

std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const void* w, DType w_type, int64_t N, int64_t K,
                                                             void* storage, std::shared_ptr<void> owner) {
  KILN_CHECK(w && storage && N > 0 && K > 0, kOp, "pack_linear_weight: bad weight [", N, ",", K, "]");
  check_weight_type(w_type);
  return onednn_call([&] {
    auto packed = std::make_shared<PackedLinearWeight>(packed_desc(N, K, w_type), storage, std::move(owner));
    memory plain(get_plan(reference_key(N, K, w_type, false))->w_plain, onednn::engine(), const_cast<void*>(w));
    dnnl::stream& stream = onednn::thread_stream();
    dnnl::reorder(plain, packed->mem).execute(stream, plain, packed->mem);
    stream.wait();
    return std::shared_ptr<const PackedLinearWeight>(std::move(packed));
  });
}

std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K, void* storage,
                                                             std::shared_ptr<void> owner) {
  return pack_linear_weight(w, DType::f32, N, K, storage, std::move(owner));
}

std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const void* w, DType w_type, int64_t N, int64_t K) {
  BufferPtr storage = host_allocate(packed_linear_weight_bytes(N, K, w_type));
  void* data = storage->data();
  return pack_linear_weight(w, w_type, N, K, data, std::move(storage));
}

std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K) {
  return pack_linear_weight(w, DType::f32, N, K);
}

void linear_f32(const float* x, const float* w, const PackedLinearWeight* packed, const float* bias, float* y,
                int64_t M, int64_t N, int64_t K) {
  KILN_CHECK(M > 0 && N > 0 && K > 0 && x && w && y, kOp, "linear_f32: bad call M=", M, " N=", N, " K=", K);
  onednn_call([&] {
    bool use_packed = false;
    const PlanKey key{M, N, K, DType::f32, bias != nullptr, DType::f32, DType::f32, false};
    const auto plan = plan_for(key, packed, use_packed);
    execute(*plan, x, w, use_packed ? packed : nullptr, bias, y);
  });
}

void linear_bf16(const void* x, const void* w, const PackedLinearWeight* packed, const void* bias, DType bias_type,
                 void* y, DType y_type, int64_t M, int64_t N, int64_t K, Bf16LinearPath path) {
  KILN_CHECK(M > 0 && N > 0 && K > 0 && x && w && y, kOp, "linear_bf16: bad call M=", M, " N=", N, " K=", K);
  KILN_CHECK(f32_or_bf16(y_type) && (!bias || f32_or_bf16(bias_type)), kOp, "linear_bf16: y ", dtype_name(y_type),
             ", bias ", dtype_name(bias_type), " (each f32 or bf16)");
  if (!bias) bias_type = DType::f32;
  if (path == Bf16LinearPath::amx && M < kAmxMinRows && bf16_dot_path_available()) path = Bf16LinearPath::dot;
  if (path == Bf16LinearPath::amx) {
    g_amx.fetch_add(1, std::memory_order_relaxed);
    return amx_linear_bf16(x, w, bias, bias_type, y, y_type, M, N, K);
  }
  onednn_call([&] {
    if (path == Bf16LinearPath::widened) return linear_bf16_widened(x, w, bias, bias_type, y, y_type, M, N, K);
    bool use_packed = false;
    const auto plan = plan_for({M, N, K, DType::bf16, bias != nullptr, bias_type, y_type, false}, packed,
                               use_packed);
    execute(*plan, x, w, use_packed ? packed : nullptr, bias, y);
  });
}

void linear_quantized(const void* x, DType x_type, const void* w, DType w_type, const void* bias, DType bias_type,
                      void* y, DType y_type, int64_t M, int64_t N, int64_t K) {
  KILN_CHECK(M > 0 && N > 0 && K > 0 && x && w && y, kOp, "linear_quantized: bad call M=", M, " N=", N, " K=", K);
  KILN_CHECK(f32_or_bf16(x_type) && is_storage_only(w_type) && f32_or_bf16(y_type) && (!bias || f32_or_bf16(bias_type)),
             kOp, "linear_quantized: x ", dtype_name(x_type), ", w ", dtype_name(w_type), ", bias ",
             dtype_name(bias_type), ", y ", dtype_name(y_type));
  if (!bias) bias_type = DType::f32;
  onednn_call([&] { linear_quantized_panels(x, x_type, w, w_type, bias, bias_type, y, y_type, M, N, K); });
}

LinearGemmCounts linear_gemm_counts() {
  return {g_prepacked.load(), g_packed_in_call.load(), g_widened.load(), g_amx.load(), g_dequantized.load()};
}

void linear_gemm_warm_up() {
  const float x[4] = {1, 2, 3, 4}, w[4] = {1, 0, 0, 1};
  float y[4] = {};
  linear_f32(x, w, nullptr, nullptr, y, 2, 2, 2);
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
