#include "devices/cpu/kernels/prepacked_weights.h"

#include <atomic>
#include <exception>
#include <string>

#include "core/error.h"
#include "devices/cpu/kernels/f32_io.h"
#include "devices/runtime.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {
namespace {

std::atomic<uint64_t> g_packed{0}, g_reused{0}, g_skipped{0}, g_bytes{0}, g_live_bytes{0};

}  // namespace

PrepackStats prepack_stats() {
  return {g_packed.load(), g_reused.load(), g_skipped.load(), g_bytes.load(), g_live_bytes.load()};
}

std::shared_ptr<const PackedLinearWeight> prepacked_linear_weight(const Tensor& w, uint64_t after_write) {
  const DType type = w.dtype();
  if (!f32_or_bf16(type) || w.rank() != 2 || !w.is_contiguous() || w.numel() == 0)
    return nullptr;
  const int64_t N = w.shape()[0], K = w.shape()[1];
  // One buffer may hold several weights (tied or sliced): the key names this one's place in it.
  const std::string key = "cpu.linear_packed@" + std::to_string(w.offset()) + ":" + std::to_string(N) + "x" +
                          std::to_string(K) + ":" + dtype_name(type);
  Buffer& buf = *w.buffer();
  if (auto found = buf.derived(key, after_write)) {
    g_reused.fetch_add(1, std::memory_order_relaxed);
    return std::static_pointer_cast<const PackedLinearWeight>(found);
  }
  DeviceRuntime& rt = runtime(w.device());
  // Under a device memory capacity the memory plan that admitted this run (estimate_memory)
  // did not count packed copies: taking room for them could fail an allocation the plan promised.
  // A weight model offload brought in for this call leaves with its packs at the end of the call:
  // packing it again on every call costs more than the packing it saves.
  if (rt.memory().capacity_bytes != 0 || buf.here_for_one_call()) {
    g_skipped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  std::shared_ptr<const PackedLinearWeight> packed;
  size_t bytes = 0;
  try {
    if (!linear_packing_keeps_bits(N, K, type)) {  // this oneDNN would give the pack other bits
      g_skipped.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    bytes = packed_linear_weight_bytes(N, K, type);
    BufferPtr storage = rt.allocate(bytes);
    void* data = storage->data();
    const size_t held = rt.allocation_size(bytes);  // what the allocator counts for it
    g_live_bytes.fetch_add(held, std::memory_order_relaxed);
    std::shared_ptr<void> owner(data, [storage = std::move(storage), held](void*) mutable {
      g_live_bytes.fetch_sub(held, std::memory_order_relaxed);
      storage.reset();
    });
    packed = pack_linear_weight(w.data_ptr(), type, N, K, data, std::move(owner));
  } catch (const std::exception&) {  // no memory or a library error: the linear reads w as it is
    g_skipped.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  buf.set_derived(key, after_write, packed);
  g_packed.fetch_add(1, std::memory_order_relaxed);
  g_bytes.fetch_add(bytes, std::memory_order_relaxed);
  return packed;
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
