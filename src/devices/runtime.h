// The interface every device backend implements: memory, an in-order queue, kernels.
// exec/ talks to devices only through this; models never see it.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/buffer.h"
#include "core/tensor_view.h"

namespace kiln {

struct FusedProgram;
struct Graph;
class Tensor;

struct KernelArgs {
  std::vector<TensorView> in;
  TensorView out;
  const Attrs* attrs = nullptr;
  // A device's ahead-of-time form of in[1] (the CPU: a linear weight pre-packed for its GEMM,
  // devices/cpu/kernels/prepacked_weights.h), or null: the kernel then reads in[1] as it is.
  const void* prepared = nullptr;
};
using KernelFn = void (*)(const KernelArgs&);

// What a device is asked whether it runs: an operand's shape and dtype.
struct OperandMeta {
  Shape shape;
  DType dtype = DType::f32;
};

struct MemoryStats {
  size_t in_use_bytes = 0;
  size_t peak_bytes = 0;
  size_t pooled_bytes = 0;
  size_t capacity_bytes = 0;  // 0 = unlimited
  uint64_t allocations = 0;   // buffers handed out since the process started (monotonic)
  // Part of in_use_bytes held by copies derived from weights (pre-packed GEMM weights): memory a
  // call's plan must count as taken, like the weights themselves.
  size_t derived_bytes = 0;
  // High-water mark of in-use plus pooled bytes: what the device's memory really held at most.
  size_t reserved_peak_bytes = 0;
  uint64_t pool_evictions = 0;  // cached blocks returned to the system to stay within the cache's bound
};

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual Device device() const = 0;
  // Whether the host reads and writes this device's memory in place (the CPU): host reads of its
  // tensors then need no copy, and weights can be used where the loader put them.
  virtual bool is_host() const = 0;

  // Memory. allocate() throws "[alloc] out of memory ..." past the capacity.
  virtual BufferPtr allocate(size_t bytes) = 0;
  virtual MemoryStats memory() const = 0;
  virtual void set_memory_capacity(size_t bytes) = 0;
  virtual void reset_peak_memory() = 0;
  // Returns the allocator's cached free blocks to the system.
  virtual void release_cached_memory() = 0;
  // Bytes the device could still allocate from its physical memory now, beyond what it holds
  // (for the CPU: the host's available memory, within the process's cgroup limit), or 0 when
  // unknown. Without a capacity this is what a call's fail-fast memory check compares against.
  virtual size_t physical_available_bytes() const { return 0; }
  // The physical memory the device has in all (for the CPU: the host's RAM, within the process's
  // cgroup limit), or 0 when unknown.
  virtual size_t physical_total_bytes() const { return 0; }

  // Queue: enqueue returns at once with a sequence number; wait_for blocks the host.
  // `output_bytes`: what the work writes into memory the host allocated for it (max_in_flight_bytes).
  virtual uint64_t enqueue(std::string what, std::function<void()> work, size_t output_bytes) = 0;
  virtual void wait_for(uint64_t seq) = 0;
  virtual uint64_t last_enqueued() const = 0;
  virtual uint64_t completed() const = 0;
  // How many items the host may queue ahead of the device (KILN_MAX_PENDING on the CPU): their
  // outputs and inputs are all alive at once, which memory estimates must count.
  virtual size_t max_in_flight() const = 0;
  // The output bytes those queued items may hold (KILN_MAX_PENDING_BYTES on the CPU; one item over
  // it is let in when nothing is queued): the host waits rather than allocate far ahead of slow
  // kernels.
  virtual size_t max_in_flight_bytes() const = 0;
  // The bytes allocate(bytes) really takes from the capacity (its size class).
  virtual size_t allocation_size(size_t bytes) const = 0;

  // ---- copies between address spaces, ordered on the queue ----
  // Host memory this device copies from and to without an extra staging copy (pinned,
  // page-locked memory on an accelerator; ordinary host memory on the CPU).
  virtual BufferPtr allocate_staging(size_t bytes) { return host_allocate(bytes); }
  // Queues a copy of `bytes` from `src` at `src_offset` to `dst` at `dst_offset`, each buffer on
  // this device or in host memory (Device::cpu()): host to device, device to host or within the
  // device. Returns its sequence number on the queue, which is the copy's event: wait_for(seq)
  // returns once the bytes have landed. The queued copy holds both buffers; it runs after every
  // earlier item on the queue, so a source this device computes is read once it is written.
  virtual uint64_t copy(const BufferPtr& src, size_t src_offset, const BufferPtr& dst, size_t dst_offset,
                        size_t bytes) = 0;

  // Wall seconds and count of the queued work run so far, by launch name (the op name in strict
  // eager, "fused_elementwise" or "<op>+epilogue" in deferred mode): where a step's time goes.
  virtual std::map<std::string, std::pair<double, uint64_t>> kernel_times() const = 0;
  virtual void reset_kernel_times() = 0;

  // The kernel implementing `op` on this device, or nullptr.
  virtual KernelFn kernel(const std::string& op) const = 0;
  // Whether this device runs `op` on inputs like these (its kernel exists and takes their dtypes
  // and layouts). Checked when an op is dispatched or a graph is prepared, so an op a device lacks
  // is an error naming the op, the device and the inputs, before anything is queued.
  virtual bool supports(const std::string& op, const std::vector<OperandMeta>& inputs) const {
    (void)inputs;
    return kernel(op) != nullptr;
  }

  // ---- launches of deferred and compiled mode beyond one op (called from queued work) ----
  // A fused elementwise program (graph/fused_program.h) over the output's index space; `out` is
  // dense and overlaps no input. Throws "[fused] ..." for an invalid program. (An epilogue's
  // program runs over its chain's output in place: each element reads that element of the output,
  // or, only where fused_tiles_hold_whole_rows(), a view that reorders elements within a row.)
  virtual void fused_elementwise(const FusedProgram& program, const std::vector<TensorView>& inputs,
                                 const TensorView& out) const = 0;
  // Whether this device's fused kernels compute whole rows of the last dim in one tile, so a
  // program may read a row-local view (RoPE's pair swap) of the rows it rewrites in place
  // (graph/fusion.h, FusionLimits::whole_row_tiles). A kernel that gives each thread one element
  // would race there, so the default is no: partition then keeps such consumers in their own launch.
  virtual bool fused_tiles_hold_whole_rows() const { return false; }
  // Several one-row linears reading the same row, as one launch: each element is one linear's
  // arguments (x, w[, bias]) -> out.
  virtual void grouped_linear_rows(const std::vector<KernelArgs>& linears) const = 0;
  // Whether a linear of `rows` rows, with x and weight of these dtypes, reads its weight in a
  // form this device prepares once per weight (KernelArgs::prepared: compiled mode's pre-packed
  // weights); none by default.
  virtual bool linear_reads_prepared_weight(int64_t rows, DType x, DType w) const {
    (void)rows, (void)x, (void)w;
    return false;
  }
  // That prepared form of module weight `w` as the write numbered `after_write` left it (its
  // buffer's ready_seq() when the reading launch was enqueued), made now when there is none; null
  // when the device keeps none, and the linear then reads `w` as it is.
  virtual std::shared_ptr<const void> prepared_linear_weight(const Tensor& w, uint64_t after_write) const {
    (void)w, (void)after_write;
    return nullptr;
  }

  // Counts a device keeps of its own work, by name (PJRT: "programs_compiled",
  // "programs_loaded_from_disk", "programs_reused", "programs_executed", "whole_graphs_run"):
  // what run reports print beside kiln's counters. None by default.
  virtual std::map<std::string, uint64_t> device_counters() const { return {}; }
  // How a device chose to run its work, by name (the CPU: "bf16_linear", its bf16 linear path):
  // what run reports print beside the counters. None by default.
  virtual std::map<std::string, std::string> device_settings() const { return {}; }
  // Whether the device computes in `dtype` at full speed, not through conversions to a wider
  // type (what a user choosing --dtype is warned about).
  virtual bool computes_fast(DType) const { return true; }

  // Whether tensor-parallel ranks on this device run as threads of one process, rank r on the
  // r-th device after the first rank's, their collectives inside the device's programs (PJRT:
  // one plugin drives all its devices). Otherwise each rank is a process of its own (mpirun).
  virtual bool runs_ranks_in_process() const { return false; }

  // ---- devices that compile whole programs (PJRT: XLA fuses and plans memory itself) ----
  // Whether deferred and compiled mode hand this device each graph whole (run_whole_graph)
  // instead of kiln's launches (fused groups, epilogues, a memory arena).
  virtual bool runs_whole_graphs() const { return false; }
  // Runs canonical graph `g` on `inputs` (bound as run_graph binds them) as one program, enqueued;
  // returns its outputs, dense and freshly computed. Only called where runs_whole_graphs().
  virtual std::vector<Tensor> run_whole_graph(const Graph& g, const std::vector<Tensor>& inputs);
};

// The runtime of a device (created on first use, lives for the process), from the registry of
// the device types this build has (devices/registry.cc). Throws "[device] ..." naming the device
// for a type this build lacks, an index the machine lacks, or a device that failed to start.
DeviceRuntime& runtime(const Device& device);

// The runtime `op` on `inputs` will run on, after checking it supports them: throws naming the
// op, the device and the inputs' dtypes otherwise.
DeviceRuntime& runtime_for(const std::string& op, const Device& device, const std::vector<OperandMeta>& inputs);

}  // namespace kiln
