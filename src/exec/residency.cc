#include "exec/residency.h"

#include "core/env.h"
#include "core/error.h"
#include "core/mapped_pages.h"
#include "devices/runtime.h"
#include "exec/executable_store.h"
#include "exec/host.h"

namespace kiln {

namespace {
thread_local ComponentWeights* t_collector = nullptr;
}  // namespace

void ComponentWeights::add(const Tensor& weight) {
  const BufferPtr& b = weight.buffer();
  for (const BufferPtr& have : buffers_)
    if (have == b) return;
  KILN_CHECK(!resident_, "offload", name_, ": a weight was added while the component is on the device");
  buffers_.push_back(b);
  host_data_.push_back(b->data());
  homes_.push_back(b->device());
  dtypes_.push_back(weight.dtype());
  spilled_.push_back(false);
  bytes_ += b->bytes();
}

size_t ComponentWeights::device_bytes(const Device& device) const {
  const DeviceRuntime& rt = runtime(device);
  size_t n = 0;
  for (const BufferPtr& b : buffers_) n += rt.allocation_size(b->bytes());
  return n;
}

ComponentWeights::Bytes ComponentWeights::bytes_by() const {
  Bytes b;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const size_t n = buffers_[i]->bytes();
    b.by_dtype[dtype_name(dtypes_[i])] += n;
    const char* place = resident_                  ? "device"
                        : spilled_[i]                ? "spill_file"
                        : buffers_[i]->maps_file()   ? "mapped_file"
                                                     : "host_copy";
    b.by_place[place] += n;
  }
  return b;
}

void ComponentWeights::onload(const Device& device, bool for_one_call) {
  if (resident_) return;
  synchronize(device);
  DeviceRuntime& rt = runtime(device);
  std::vector<BufferPtr> copies;
  copies.reserve(buffers_.size());
  for (const BufferPtr& b : buffers_) {
    BufferPtr copy = rt.allocate(b->bytes());  // throws "[alloc] out of memory ..." past the capacity
    rt.wait_for(rt.copy(b, 0, copy, 0, b->bytes()));
    // The copy is what kernels will read: the checkpoint pages it was made from leave the resident
    // set at once (one weight at a time, so the process never holds a component twice), and on
    // the CPU a placed component is held once; offload() finds them in the file again.
    if (b->maps_file()) release_mapped_pages(b->data(), b->bytes());
    copies.push_back(std::move(copy));
  }
  for (size_t i = 0; i < buffers_.size(); ++i) {
    void* data = copies[i]->data();
    buffers_[i]->relocate(data, std::shared_ptr<void>(copies[i], data), device, for_one_call);
  }
  resident_ = true;
  device_ = device;
}

// The host copy is the weights' source of truth (they are never written on the device): going
// back to it needs no copy, only the buffers pointing at it again.
void ComponentWeights::offload() {
  if (!resident_) return;
  synchronize(device_);
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i]->relocate(host_data_[i], nullptr, homes_[i]);
  resident_ = false;
  runtime(device_).release_cached_memory();
}

size_t ComponentWeights::host_copy_bytes() const {
  size_t n = 0;
  for (const BufferPtr& b : buffers_) n += b->maps_file() ? 0 : b->bytes();
  return n;
}

void ComponentWeights::spill_host_copies(SpillFile& file) {
  KILN_CHECK(!resident_, "offload", name_, ": weights are spilled from the host, not from the device");
  for (size_t i = 0; i < buffers_.size(); ++i) {
    Buffer& b = *buffers_[i];
    if (b.maps_file() || b.bytes() == 0) continue;
    synchronize(b.device());  // its bytes must be final before they are copied
    SpillFile::Mapping m = file.write(b.data(), b.bytes());
    b.rehome(m.data, std::move(m.owner), /*maps_file=*/true);
    host_data_[i] = m.data;
    spilled_[i] = true;
  }
}

std::filesystem::path offload_spill_dir() {
  if (const auto v = env::text("KILN_SPILL_DIR"))
    return *v == "none" ? std::filesystem::path() : std::filesystem::path(*v);
  const std::filesystem::path cache = executable_cache_dir();
  return cache.empty() ? std::filesystem::temp_directory_path() : cache;
}

WeightCollector::WeightCollector(ComponentWeights& component) : previous_(t_collector) { t_collector = &component; }
WeightCollector::~WeightCollector() { t_collector = previous_; }
ComponentWeights* WeightCollector::active() { return t_collector; }

}  // namespace kiln
