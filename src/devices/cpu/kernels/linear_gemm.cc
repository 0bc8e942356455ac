#include "devices/cpu/kernels/linear_gemm.h"

#include <atomic>
#include <compare>
#include <map>
#include <mutex>
#include <string>

#include "core/buffer.h"
#include "core/error.h"
#include "devices/cpu/kernels/gemm.h"
#include "devices/cpu/kernels/onednn.h"

namespace kiln::cpu {

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

std::atomic<int64_t> g_prepacked{0}, g_packed_in_call{0};

struct PlanKey {
  int64_t M, N, K;
  bool bias, packed;  // packed: the primitive reads weights in its own (blocked) layout
  auto operator<=>(const PlanKey&) const = default;
};

struct LinearPlan {
  memory::desc x, w_plain, bias, y;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
};

std::shared_ptr<const LinearPlan> build_plan(const PlanKey& k) {
  const auto f32 = memory::data_type::f32;
  auto p = std::make_shared<LinearPlan>();
  p->x = memory::desc({k.M, k.K}, f32, tag::ab);
  p->w_plain = memory::desc({k.K, k.N}, f32, tag::ba);  // [K,N] logical, stored as [N,K] rows
  p->bias = k.bias ? memory::desc({1, k.N}, f32, tag::ab) : memory::desc();
  p->y = memory::desc({k.M, k.N}, f32, tag::ab);
  const memory::desc w = k.packed ? memory::desc({k.K, k.N}, f32, tag::any) : p->w_plain;
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

// The packed layout of [N,K] (the primitive's pick for a reference row count; see the header).
memory::desc packed_desc(int64_t N, int64_t K) { return get_plan({64, N, K, false, true})->pd.weights_desc(); }

}  // namespace

bool linear_runs_on_primitive(int64_t rows) {
  return rows > 1 && rows < kPrimitiveMaxRows && gemm_backend() == GemmBackend::onednn;
}

bool linear_packing_keeps_bits(int64_t N, int64_t K) {
  KILN_CHECK(N > 0 && K > 0, kOp, "linear_packing_keeps_bits: bad weight [", N, ",", K, "]");
  return onednn_call(
      [&] { return same_kernel(*get_plan({64, N, K, false, false}), *get_plan({64, N, K, false, true})); });
}

size_t packed_linear_weight_bytes(int64_t N, int64_t K) {
  KILN_CHECK(N > 0 && K > 0, kOp, "packed_linear_weight_bytes: bad weight [", N, ",", K, "]");
  return onednn_call([&] { return packed_desc(N, K).get_size(); });
}

std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K, void* storage,
                                                             std::shared_ptr<void> owner) {
  KILN_CHECK(w && storage && N > 0 && K > 0, kOp, "pack_linear_weight: bad weight [", N, ",", K, "]");
  return onednn_call([&] {
    auto packed = std::make_shared<PackedLinearWeight>(packed_desc(N, K), storage, std::move(owner));
    memory plain(get_plan({64, N, K, false, false})->w_plain, onednn::engine(), const_cast<float*>(w));
    dnnl::stream& stream = onednn::thread_stream();
    dnnl::reorder(plain, packed->mem).execute(stream, plain, packed->mem);
    stream.wait();
    return std::shared_ptr<const PackedLinearWeight>(std::move(packed));
  });
}

std::shared_ptr<const PackedLinearWeight> pack_linear_weight(const float* w, int64_t N, int64_t K) {
  BufferPtr storage = host_allocate(packed_linear_weight_bytes(N, K));
  void* data = storage->data();
  return pack_linear_weight(w, N, K, data, std::move(storage));
}

void linear_f32(const float* x, const float* w, const PackedLinearWeight* packed, const float* bias, float* y,
                int64_t M, int64_t N, int64_t K) {
  KILN_CHECK(M > 0 && N > 0 && K > 0 && x && w && y, kOp, "linear_f32: bad call M=", M, " N=", N, " K=", K);
  onednn_call([&] {
    std::shared_ptr<const LinearPlan> plan = get_plan({M, N, K, bias != nullptr, false});
    bool use_packed = false;
    if (packed) {  // same layout, and the same kernel as the plain plan: the same bits
      auto packed_plan = get_plan({M, N, K, bias != nullptr, true});
      if (packed->mem.get_desc() == packed_plan->pd.weights_desc() && same_kernel(*plan, *packed_plan)) {
        plan = std::move(packed_plan);
        use_packed = true;
      }
    }
    const dnnl::engine& eng = onednn::engine();
    (use_packed ? g_prepacked : g_packed_in_call).fetch_add(1, std::memory_order_relaxed);
    // oneDNN takes non-const handles but only reads inputs.
    onednn::Args args{{DNNL_ARG_SRC, memory(plan->x, eng, const_cast<float*>(x))},
                      {DNNL_ARG_WEIGHTS, use_packed ? packed->mem : memory(plan->w_plain, eng, const_cast<float*>(w))},
                      {DNNL_ARG_DST, memory(plan->y, eng, y)}};
    if (bias) args.emplace(DNNL_ARG_BIAS, memory(plan->bias, eng, const_cast<float*>(bias)));
    onednn::add_scratchpad(args, plan->pd.scratchpad_desc());
    dnnl::stream& stream = onednn::thread_stream();
    plan->prim.execute(stream, args);
    stream.wait();
  });
}

LinearGemmCounts linear_gemm_counts() { return {g_prepacked.load(), g_packed_in_call.load()}; }

void linear_gemm_warm_up() {
  const float x[4] = {1, 2, 3, 4}, w[4] = {1, 0, 0, 1};
  float y[4] = {};
  linear_f32(x, w, nullptr, nullptr, y, 2, 2, 2);
}

}  // namespace kiln::cpu
