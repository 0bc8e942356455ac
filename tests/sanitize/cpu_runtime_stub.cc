// A minimal kiln::runtime for the sanitizer build, which links only the checkpoint reader and
// src/core (not the device backends): host memory from aligned_alloc, work run inline.
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "devices/runtime.h"

namespace kiln {
namespace {

class StubCpuRuntime final : public DeviceRuntime {
 public:
  Device device() const override { return Device::cpu(); }
  bool is_host() const override { return true; }

  BufferPtr allocate(size_t bytes) override {
    const size_t rounded = (bytes + 63) / 64 * 64;  // aligned_alloc wants a multiple of 64
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    KILN_CHECK(p != nullptr, "alloc", "out of memory allocating ", bytes, " bytes");
    return std::make_shared<Buffer>(p, bytes, Device::cpu(), [p] { std::free(p); });
  }
  MemoryStats memory() const override { return {}; }
  void set_memory_capacity(size_t) override {}
  void reset_peak_memory() override {}
  void release_cached_memory() override {}

  uint64_t enqueue(std::string, std::function<void()> work, size_t) override {
    work();
    return ++seq_;
  }
  uint64_t copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
                size_t bytes) override {
    std::memcpy(static_cast<char*>(dst->data()) + dst_offset, static_cast<const char*>(src->data()) + src_offset, bytes);
    return ++seq_;
  }
  void wait_for(uint64_t) override {}
  uint64_t last_enqueued() const override { return seq_; }
  uint64_t completed() const override { return seq_; }
  size_t max_in_flight() const override { return 1; }
  size_t max_in_flight_bytes() const override { return ~size_t{0}; }
  size_t allocation_size(size_t bytes) const override { return bytes; }
  std::map<std::string, std::pair<double, uint64_t>> kernel_times() const override { return {}; }
  void reset_kernel_times() override {}
  KernelFn kernel(const std::string&) const override { return nullptr; }
  void fused_elementwise(const FusedProgram&, const std::vector<TensorView>&, const TensorView&) const override {
    fail("device", "the sanitizer build runs no kernels");
  }
  void grouped_linear_rows(const std::vector<KernelArgs>&) const override {
    fail("device", "the sanitizer build runs no kernels");
  }

 private:
  uint64_t seq_ = 0;
};

}  // namespace

DeviceRuntime& runtime(const Device& device) {
  KILN_CHECK(device.type == DeviceType::cpu, "device", device.str(),
             " not available in the sanitizer build");
  static StubCpuRuntime cpu_runtime;
  return cpu_runtime;
}

}  // namespace kiln
