// The CPU device: pooled allocator, one asynchronous in-order queue, the kernel table.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "core/env.h"
#include "core/error.h"
#include "core/terminal.h"
#include "devices/cpu/allocator.h"
#include "devices/cpu/cpu_runtime.h"
#include "devices/cpu/kernel_set.h"
#include "devices/cpu/queue.h"
#include "devices/runtime.h"
#include "distributed/process_group.h"

namespace kiln {

namespace cpu {
namespace {

size_t max_pending_from_env() {
  return size_t(env::positive_int("KILN_MAX_PENDING").value_or(32));
}
size_t max_pending_bytes_from_env() {
  return size_t(env::positive_int("KILN_MAX_PENDING_BYTES").value_or(size_t(256) << 20));
}

// The first line of `path` that `format` (one %llu) reads, or nullopt.
std::optional<unsigned long long> scan_file(const char* path, const char* format) {
  std::FILE* f = std::fopen(path, "r");
  if (!f) return std::nullopt;
  char line[256];
  std::optional<unsigned long long> found;
  unsigned long long v = 0;
  while (!found && std::fgets(line, sizeof line, f))
    if (std::sscanf(line, format, &v) == 1) found = v;
  std::fclose(f);
  return found;
}
size_t meminfo_bytes(const char* format) { return size_t(scan_file("/proc/meminfo", format).value_or(0)) * 1024; }
// A cgroup (v2) file holding one number; "max" reads as none.
std::optional<unsigned long long> cgroup_number(const char* file) { return scan_file(file, "%llu"); }

// MemAvailable from /proc/meminfo, lowered to what the process's cgroup (v2) still allows.
size_t host_available_bytes() {
  size_t available = meminfo_bytes("MemAvailable: %llu kB");
  const auto limit = cgroup_number("/sys/fs/cgroup/memory.max");
  auto used = cgroup_number("/sys/fs/cgroup/memory.current");
  // The cgroup's page cache it could drop (inactive_file: the mapped checkpoint, say) is not used.
  if (used)
    if (const auto inactive = scan_file("/sys/fs/cgroup/memory.stat", "inactive_file %llu"))
      *used -= std::min(*used, *inactive);
  if (limit && used && *limit > *used) available = available ? std::min(available, size_t(*limit - *used)) : size_t(*limit - *used);
  return available;
}

// MemTotal from /proc/meminfo, lowered to the process's cgroup (v2) limit.
size_t host_total_bytes() {
  size_t total = meminfo_bytes("MemTotal: %llu kB");
  if (const auto limit = cgroup_number("/sys/fs/cgroup/memory.max"); limit && (total == 0 || size_t(*limit) < total))
    total = size_t(*limit);
  return total;
}

class CpuRuntime final : public DeviceRuntime {
 public:
  explicit CpuRuntime(const CpuKernelSet& set)
      : set_(set), allocator_(Device::cpu()), queue_(max_pending_from_env(), max_pending_bytes_from_env()) {
    set_.add_kernels(kernels_);
    // Its queue may hold collective kernels when the process exits: MPI must outlive them.
    before_world_finalize([this] { queue_.wait_for(queue_.last_enqueued()); });
  }
  Device device() const override { return Device::cpu(); }
  bool is_host() const override { return true; }

  BufferPtr allocate(size_t bytes) override { return allocator_.allocate(bytes); }
  MemoryStats memory() const override {
    const AllocatorStats s = allocator_.stats();
    return MemoryStats{s.in_use_bytes,  s.peak_bytes,  s.pooled_bytes,
                       s.capacity_bytes, s.allocations, size_t(set_.prepacked_live_bytes()),
                       s.reserved_peak_bytes, s.pool_evictions};
  }
  void set_memory_capacity(size_t bytes) override { allocator_.set_capacity(bytes); }
  void reset_peak_memory() override { allocator_.reset_peak(); }
  void release_cached_memory() override { allocator_.release_pool(); }
  size_t physical_available_bytes() const override { return host_available_bytes() + allocator_.stats().pooled_bytes; }
  size_t physical_total_bytes() const override { return host_total_bytes(); }

  uint64_t enqueue(std::string what, std::function<void()> work, size_t output_bytes) override {
    return queue_.enqueue(std::move(what), std::move(work), output_bytes);
  }
  // Every buffer is host memory here; the copy is queued so it is ordered after the work that
  // writes its source, as on a device with its own memory.
  uint64_t copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
                size_t bytes) override {
    KILN_CHECK(src_offset + bytes <= src->bytes() && dst_offset + bytes <= dst->bytes(), "copy", "copying ", bytes,
               " bytes from offset ", src_offset, " of a ", src->bytes(), "-byte buffer to offset ", dst_offset,
               " of a ", dst->bytes(), "-byte buffer");
    KILN_CHECK(src->device().type == DeviceType::cpu && dst->device().type == DeviceType::cpu, "copy", "the CPU copies ",
               "between host buffers only, not from ", src->device().str(), " to ", dst->device().str());
    return queue_.enqueue("transfer", [src, src_offset, dst, dst_offset, bytes] {
      std::memcpy(static_cast<char*>(dst->data()) + dst_offset, static_cast<const char*>(src->data()) + src_offset, bytes);
    }, 0);
  }
  void wait_for(uint64_t seq) override { queue_.wait_for(seq); }
  uint64_t last_enqueued() const override { return queue_.last_enqueued(); }
  uint64_t completed() const override { return queue_.completed(); }
  size_t max_in_flight() const override { return queue_.max_pending(); }
  size_t max_in_flight_bytes() const override { return queue_.max_pending_bytes(); }
  size_t allocation_size(size_t bytes) const override { return Allocator::round_size(bytes); }
  std::map<std::string, std::pair<double, uint64_t>> kernel_times() const override { return queue_.time_by_name(); }
  std::map<std::string, uint64_t> device_counters() const override { return set_.counters(); }
  std::map<std::string, std::string> device_settings() const override { return set_.settings(); }
  // f16 has arithmetic of its own only with AVX512-FP16; elsewhere every f16 op converts to f32.
  bool computes_fast(DType dtype) const override {
    return dtype != DType::f16 || __builtin_cpu_supports("avx512fp16");
  }
  void reset_kernel_times() override { queue_.reset_time_by_name(); }

  KernelFn kernel(const std::string& op) const override { return find_kernel(kernels_, op); }
  bool supports(const std::string& op, const std::vector<OperandMeta>& inputs) const override {
    return table_supports(kernels_, op, inputs);
  }

  void fused_elementwise(const FusedProgram& program, const std::vector<TensorView>& inputs,
                         const TensorView& out) const override {
    set_.fused_elementwise(program, inputs, out);
  }
  void grouped_linear_rows(const std::vector<KernelArgs>& linears) const override {
    set_.grouped_linear_rows(linears);
  }
  // A tile of short rows is several whole rows (kernels/tiles.h): every element a row-local view
  // reads is loaded before the tile's row is stored.
  bool fused_tiles_hold_whole_rows() const override { return true; }
  bool linear_reads_prepared_weight(int64_t rows, DType x, DType w) const override {
    return set_.linear_reads_packed_weight(rows, x, w);
  }
  std::shared_ptr<const void> prepared_linear_weight(const Tensor& w, uint64_t after_write) const override {
    return set_.prepacked_linear_weight(w, after_write);
  }

 private:
  const CpuKernelSet& set_;
  Allocator allocator_;
  Queue queue_;
  KernelTable kernels_;
};

}  // namespace
}  // namespace cpu

namespace cpu {

DeviceRuntime& runtime_of(int index) {
  KILN_CHECK(index == 0, "device", "cpu:", index, " does not exist (the CPU is cpu:0)");
  // Never destroyed: buffers released during static destruction still return to the pool.
  // At exit, queued work is drained first: a program
  // that returns or throws while kernels are still queued must not tear down the libraries
  // those kernels use under them. Exit handlers run in reverse order of registration, so the
  // libraries' lazily built state is built first (warm-up) and the drain registered after it.
  // (Registering a drain after each kind of work first runs is not enough: the crash this
  // prevents happened while the very first matmul was still building oneDNN's JIT kernels.)
  // Errors of dropped work are reported as a warning.
  static cpu::CpuRuntime* rt = [] {
    const CpuKernelSet& set = cpu_kernel_set();
    auto* r = new cpu::CpuRuntime(set);
    set.warm_up();
    std::atexit([] {
      try {
        rt->wait_for(rt->last_enqueued());
      } catch (const std::exception& e) {
        print_line(stderr, "kiln: warning: queued work failed at exit: %s", e.what());
      }
    });
    return r;
  }();
  return *rt;
}

}  // namespace cpu

}  // namespace kiln
