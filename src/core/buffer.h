// A Buffer is a block of device memory that tensors view. It is reference counted
// (std::shared_ptr): work queued on a device holds a reference to every buffer it
// touches, so dropping the last user handle while a kernel still runs is safe.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/device.h"

namespace kiln {

class Buffer {
 public:
  // `release` runs when the last reference goes (returns memory to a pool, unmaps a file, ...).
  Buffer(void* data, size_t bytes, Device device, std::function<void()> release)
      : data_(data), bytes_(bytes), device_(device), release_(std::move(release)), serial_(next_serial()) {}
  ~Buffer() {
    if (release_) release_();
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }

  // Points this buffer at other bytes of the same size on `device` (model offload,
  // exec/residency.h: a weight's buffer moves between its host copy and a device copy while every
  // tensor viewing it stays valid, and says where its bytes now are). `keep` owns the new bytes
  // (null: they are this buffer's own again). Only call it when no queued work uses the buffer.
  // `for_one_call`: model offload brought the bytes in for the current pipeline call only.
  // Drops every derived value (they describe bytes that now live elsewhere).
  void relocate(void* data, std::shared_ptr<void> keep, const Device& device, bool for_one_call = false) {
    data_ = data;
    device_ = device;
    relocated_owner_ = std::move(keep);
    for_one_call_ = for_one_call;
    std::lock_guard<std::mutex> lock(derived_mu_);
    derived_.clear();
  }
  bool here_for_one_call() const { return for_one_call_; }
  // Replaces the bytes this buffer owns by an equal copy elsewhere, which `keep` owns from now on
  // (model offload moves a host copy into a spill file: core/spill_file.h). The old bytes are
  // released at once. Only call it when no queued work uses the buffer and it is not relocated.
  void rehome(void* data, std::shared_ptr<void> keep, bool maps_file) {
    std::function<void()> old = std::move(release_);
    data_ = data;
    release_ = nullptr;
    home_owner_ = std::move(keep);
    maps_file_ = maps_file;
    if (old) old();
  }
  // Whether the bytes it was made with are a view of a mapped checkpoint file (zero-copy
  // weights), so reports can say where a weight lives. Set once, by the loader that made it.
  void mark_file_mapping() { maps_file_ = true; }
  bool maps_file() const { return maps_file_; }
  size_t bytes() const { return bytes_; }
  // Where the bytes are now (a tensor's device is its buffer's: relocate() moves it).
  const Device& device() const { return device_; }

  // Sequence number (on the device queue) of the last enqueued work that writes this buffer;
  // a host read waits until the queue has completed it. 0 = nothing pending.
  uint64_t ready_seq() const { return ready_seq_.load(std::memory_order_acquire); }
  void set_ready_seq(uint64_t s) { ready_seq_.store(s, std::memory_order_release); }

  // Creation order of buffers in this process (1, 2, ...). Compiled mode uses it to tell a
  // constant made while tracing (a host scalar) from state that existed before (a weight that
  // should have been declared a parameter).
  uint64_t serial() const { return serial_; }
  static uint64_t serials_issued() { return counter().load(std::memory_order_relaxed); }

  // Values a device derives from this buffer's bytes and keeps beside them, e.g. a linear weight
  // pre-packed into the GEMM library's layout (compiled mode). A value holds for the bytes as the
  // write with sequence number `after_write` left them: readers pass ready_seq() as it was when
  // they were enqueued, so a later queued write (which sets ready_seq) makes them derive again.
  // Whoever writes a buffer's bytes from the host must do it before any reader derives from them
  // (as every host copy in kiln does: into a fresh buffer). relocate() drops them all, and they
  // die with the buffer. Thread-safe.
  std::shared_ptr<const void> derived(const std::string& key, uint64_t after_write) const {
    std::lock_guard<std::mutex> lock(derived_mu_);
    for (const Derived& d : derived_)
      if (d.key == key && d.after_write == after_write) return d.value;
    return nullptr;
  }
  void set_derived(const std::string& key, uint64_t after_write, std::shared_ptr<const void> value) {
    std::lock_guard<std::mutex> lock(derived_mu_);
    for (Derived& d : derived_)
      if (d.key == key) {
        d = Derived{key, after_write, std::move(value)};
        return;
      }
    derived_.push_back(Derived{key, after_write, std::move(value)});
  }

 private:
  void* data_;
  std::shared_ptr<void> relocated_owner_;  // the device copy while relocated
  std::shared_ptr<void> home_owner_;       // its own bytes, once rehome() moved them
  bool maps_file_ = false;
  bool for_one_call_ = false;  // read on the queue: written only by relocate(), with no work queued
  size_t bytes_;
  Device device_;
  std::function<void()> release_;
  std::atomic<uint64_t> ready_seq_{0};
  uint64_t serial_;
  struct Derived {
    std::string key;
    uint64_t after_write;
    std::shared_ptr<const void> value;
  };
  mutable std::mutex derived_mu_;
  std::vector<Derived> derived_;

  static std::atomic<uint64_t>& counter() {
    static std::atomic<uint64_t> c{0};
    return c;
  }
  static uint64_t next_serial() { return counter().fetch_add(1, std::memory_order_relaxed) + 1; }
};

using BufferPtr = std::shared_ptr<Buffer>;

// Host memory (64-byte aligned, freed with the buffer): weights that cannot be used in place
// from their checkpoint (converted, sliced, packed). Not device memory: the device allocator
// does not count it (exec/residency.h copies weights to the device when they must be there).
// Blocks of kHostMappingBytes and more are mappings of their own, whose pages leave the process
// when the buffer is freed.
BufferPtr host_allocate(size_t bytes);
// Host address space only: read-only pages that are never touched, so neither committed nor
// counted against the machine's memory (what a memory plan's placeholders stand on). nullptr when
// even the address space is missing.
BufferPtr host_reserve(size_t bytes);
inline constexpr size_t kHostMappingBytes = size_t(1) << 20;

}  // namespace kiln
