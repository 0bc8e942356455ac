// A Buffer is a block of device memory that tensors view. It is reference counted
// (std::shared_ptr): work queued on a device holds a reference to every buffer it
// touches, so dropping the last user handle while a kernel still runs is safe.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/device.h"

namespace kiln {

class Buffer {
 public:
  // `release` runs when the last reference goes (returns memory to a pool, unmaps a file, ...).
  Buffer(void* data, size_t bytes, Device device, std::function<void()> release)
      : data_(data), bytes_(bytes), device_(device), release_(std::move(release)) {}
  ~Buffer() {
    if (release_) release_();
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const Device& device() const { return device_; }

  // Sequence number (on the device queue) of the last enqueued work that writes this buffer;
  // a host read waits until the queue has completed it. 0 = nothing pending.
  uint64_t ready_seq() const { return ready_seq_.load(std::memory_order_acquire); }
  void set_ready_seq(uint64_t s) { ready_seq_.store(s, std::memory_order_release); }

 private:
  void* data_;
  size_t bytes_;
  Device device_;
  std::function<void()> release_;
  std::atomic<uint64_t> ready_seq_{0};
};

using BufferPtr = std::shared_ptr<Buffer>;

}  // namespace kiln
