// The CUDA device: a pooled allocator over cudaMalloc, one stream whose events are the queue's
// sequence numbers, copies between host and device memory on that stream (pinned staging), and
// the kernel table (generated elementwise kernels, cuBLASLt GEMMs).
//
// The queue: enqueue() runs its work at once on the calling thread, which launches kernels onto
// the stream and returns; an event recorded after them is the item's sequence number, and
// wait_for() waits on it. Buffers a launch used may go back to the pool as soon as the work
// returns: blocks are reused only by later launches on the same stream, which run after it.
// Host memory a queued copy reads or writes is held until its event has passed.
#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "core/error.h"
#include "devices/copy_check.h"
#include "devices/cuda/check.h"
#include "devices/cuda/cuda_runtime.h"
#include "devices/cuda/kernels/kernel_table.h"
#include "devices/cuda/launch.h"
#include "devices/cuda/libraries.h"
#include "devices/kernel_times.h"
#include "devices/pool_allocator.h"

namespace kiln::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's scratch (Hopper's kernels want 32 MiB)

BlockSource device_blocks(int index) {
  return {[index](size_t bytes) -> void* {
            void* p = nullptr;
            if (cudaSetDevice(index) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
              cudaGetLastError();  // clear the out-of-memory error: the pool retries or reports it
              return nullptr;
            }
            return p;
          },
          [index](void* p, size_t) {
            cudaSetDevice(index);
            cudaFree(p);
          }};
}

BlockSource pinned_blocks() {
  return {[](size_t bytes) -> void* {
            void* p = nullptr;
            if (cudaMallocHost(&p, bytes) != cudaSuccess) {
              cudaGetLastError();
              return nullptr;
            }
            return p;
          },
          [](void* p, size_t) { cudaFreeHost(p); }};
}

class CudaRuntime final : public DeviceRuntime {
 public:
  explicit CudaRuntime(int index)
      : index_(index), allocator_(Device{DeviceType::cuda, index}, device_blocks(index)),
        staging_(Device::cpu(), pinned_blocks()) {
    KILN_CUDA_CHECK(cudaSetDevice(index));
    int major = 0, minor = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index));
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index));
    kernel_cache_ = std::make_unique<KernelCache>(major * 10 + minor);
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&context_.stream, cudaStreamNonBlocking));
    KILN_CUBLAS_CHECK(cublaslt().Create(&context_.lt));
    KILN_CUDA_CHECK(cudaMalloc(&context_.workspace, kWorkspaceBytes));
    context_.device = index;
    context_.kernels = kernel_cache_.get();
    context_.workspace_bytes = kWorkspaceBytes;
  }

  Device device() const override { return Device{DeviceType::cuda, index_}; }
  bool is_host() const override { return false; }

  BufferPtr allocate(size_t bytes) override { return allocator_.allocate(bytes); }
  MemoryStats memory() const override {
    const AllocatorStats s = allocator_.stats();
    return MemoryStats{s.in_use_bytes, s.peak_bytes, s.pooled_bytes, s.capacity_bytes, s.allocations, 0,
                       s.reserved_peak_bytes, s.pool_evictions};
  }
  void set_memory_capacity(size_t bytes) override { allocator_.set_capacity(bytes); }
  void reset_peak_memory() override { allocator_.reset_peak(); }
  void release_cached_memory() override { allocator_.release_pool(); }  // cudaFree waits for the device
  size_t physical_available_bytes() const override { return device_memory().first + allocator_.stats().pooled_bytes; }
  size_t physical_total_bytes() const override { return device_memory().second; }

  BufferPtr allocate_staging(size_t bytes) override { return staging_.allocate(bytes); }

  uint64_t enqueue(std::string what, std::function<void()> work, size_t) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    KILN_CUDA_CHECK(cudaSetDevice(index_));
    const auto t0 = std::chrono::steady_clock::now();
    {
      LaunchScope scope(&context_);
      work();
    }
    times_.add(what, std::chrono::steady_clock::now() - t0);
    return record_locked({});
  }

  uint64_t copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
                size_t bytes) override {
    const auto [from_host, to_host] = check_copy(device(), src, src_offset, dst, dst_offset, bytes);
    const cudaMemcpyKind kind = from_host ? (to_host ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                                          : (to_host ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    KILN_CUDA_CHECK(cudaSetDevice(index_));
    if (bytes)
      KILN_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst->data()) + dst_offset,
                                      static_cast<const char*>(src->data()) + src_offset, bytes, kind, context_.stream));
    times_.count("transfer");
    return record_locked({src, dst});
  }

  // Waits on the event of the last item numbered <= seq (the stream runs in order, so every
  // earlier one is done too) without holding the lock, then retires them. Were that event retired
  // and recorded again meanwhile, the wait would only be longer, never too short.
  void wait_for(uint64_t seq) override {
    std::unique_lock<std::recursive_mutex> lock(mu_);
    if (pending_.empty() || pending_.front().seq > seq) return;
    size_t last = 0;
    while (last + 1 < pending_.size() && pending_[last + 1].seq <= seq) ++last;
    const cudaEvent_t event = pending_[last].event;
    lock.unlock();
    const cudaError_t e = cudaEventSynchronize(event);
    lock.lock();
    while (!pending_.empty() && pending_.front().seq <= seq) {
      completed_ = std::max(completed_, pending_.front().seq);
      free_events_.push_back(pending_.front().event);
      pending_.pop_front();
    }
    if (e != cudaSuccess) fail_cuda("cudaEventSynchronize (a queued kernel failed)", e);
  }
  uint64_t last_enqueued() const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    return last_;
  }
  uint64_t completed() const override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    while (!pending_.empty() && cudaEventQuery(pending_.front().event) == cudaSuccess) {
      completed_ = pending_.front().seq;
      free_events_.push_back(pending_.front().event);
      pending_.pop_front();
    }
    return pending_.empty() ? last_ : completed_;
  }
  // A block freed by the host is reusable at once (stream order), so only one item's buffers
  // count as in flight, however far the host runs ahead.
  size_t max_in_flight() const override { return 1; }
  size_t max_in_flight_bytes() const override { return ~size_t{0}; }
  size_t allocation_size(size_t bytes) const override { return PoolAllocator::round_size(bytes); }
  // Host seconds spent issuing each kind of work (launches are asynchronous: not kernel time).
  std::map<std::string, std::pair<double, uint64_t>> kernel_times() const override { return times_.snapshot(); }
  void reset_kernel_times() override { times_.reset(); }

  KernelFn kernel(const std::string& op) const override { return find_kernel(kernels_, op); }
  bool supports(const std::string& op, const std::vector<OperandMeta>& inputs) const override {
    return table_supports(kernels_, op, inputs);
  }

  void fused_elementwise(const FusedProgram& program, const std::vector<TensorView>& inputs,
                         const TensorView& out) const override {
    launch_fused(program, inputs, out);
  }
  void grouped_linear_rows(const std::vector<KernelArgs>& linears) const override {
    const KernelFn linear = kernel("linear");
    for (const KernelArgs& args : linears) linear(args);
  }

 private:
  struct Pending {
    uint64_t seq;
    cudaEvent_t event;
    std::vector<BufferPtr> held;  // host memory an asynchronous copy still reads or writes
  };

  uint64_t record_locked(std::vector<BufferPtr> held) {
    cudaEvent_t e = nullptr;
    if (free_events_.empty()) {
      KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    } else {
      e = free_events_.back();
      free_events_.pop_back();
    }
    KILN_CUDA_CHECK(cudaEventRecord(e, context_.stream));
    pending_.push_back(Pending{++last_, e, std::move(held)});
    return last_;
  }

  std::pair<size_t, size_t> device_memory() const {
    size_t free = 0, total = 0;
    if (cudaSetDevice(index_) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) cudaGetLastError();
    return {free, total};
  }

  int index_;
  PoolAllocator allocator_;
  PoolAllocator staging_;
  std::unique_ptr<KernelCache> kernel_cache_;
  LaunchContext context_;
  const KernelTable& kernels_ = cuda_kernels();
  // Recursive: queued work that asks the runtime for something (a copy, its progress) runs while
  // enqueue holds the lock on the same thread.
  mutable std::recursive_mutex mu_;
  uint64_t last_ = 0;
  mutable uint64_t completed_ = 0;
  mutable std::deque<Pending> pending_;
  mutable std::vector<cudaEvent_t> free_events_;
  KernelTimes times_;
};

}  // namespace

DeviceRuntime& runtime_of(int index) {
  static std::mutex mu;
  static std::vector<CudaRuntime*> runtimes;  // never destroyed: the CUDA libraries tear down on their own at exit
  std::lock_guard<std::mutex> lock(mu);
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("device", "cuda:", index, " is not available: ", cudaGetErrorString(e), " (", cudaGetErrorName(e), ")");
  }
  KILN_CHECK(index >= 0 && index < count, "device", "cuda:", index, " is not available: this machine has ", count,
             " CUDA device", count == 1 ? "" : "s");
  if (runtimes.size() < size_t(count)) runtimes.resize(size_t(count), nullptr);
  if (!runtimes[size_t(index)]) runtimes[size_t(index)] = new CudaRuntime(index);
  return *runtimes[size_t(index)];
}

}  // namespace kiln::cuda
