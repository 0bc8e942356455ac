// Where a model component's weights live. The host copy — the
// mmapped safetensors, or host memory when a dtype conversion was needed — is the source of
// truth. Onload copies every weight into device memory (the device allocator, counted and
// capacity-limited) and points the weights' buffers at the copies, so the model, its compiled
// executables and any tensor viewing a weight keep working unchanged; offload points them back
// at the host bytes and frees the device copies. Weights are immutable, so nothing is ever
// copied back.
//
// Under model offload a host copy made at load (weights quantized or converted, which have no
// checkpoint file to fall back on) would otherwise stay in memory beside the device copy, and
// while the component waits for its turn: spill_host_copies() moves those bytes into a spill
// file (core/spill_file.h), after which they behave as a mapped checkpoint's do.
//
// A component learns its weights while its model is built: every tensor an nn::Weights hands
// out inside a WeightCollector scope is added to that component.
#pragma once
#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include "core/spill_file.h"
#include "core/tensor.h"

namespace kiln {

class ComponentWeights {
 public:
  explicit ComponentWeights(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }

  void add(const Tensor& weight);  // once per buffer; later adds of the same buffer are ignored
  size_t bytes() const { return bytes_; }  // the weights' own bytes
  // What onload takes from `device`'s capacity (each copy rounded to the allocator's size class).
  size_t device_bytes(const Device& device) const;
  size_t count() const { return buffers_.size(); }
  // The weights' bytes by dtype ("bf16", ...) and by where they live now: "mapped_file" (read in
  // place from a checkpoint's mapping), "host_copy" (host memory: converted or quantized at load,
  // joined shards, a misaligned tensor), "spill_file" (a host copy moved into a spill file) or
  // "device" (copied to the device: pipe.to, model offload).
  struct Bytes {
    std::map<std::string, size_t> by_dtype, by_place;
  };
  Bytes bytes_by() const;
  bool resident() const { return resident_; }

  // Both wait for the device's queued work first (a kernel may still read the weights), and
  // are no-ops when already in that state. onload throws the allocator's out-of-memory error
  // (and leaves the component on the host) when the copies do not fit. offload also returns the
  // device's cached free blocks to the system, so the process really shrinks.
  // `for_one_call`: model offload brings it in for one pipeline call (device caches derived from
  // the weights, such as pre-packed copies, are then not worth making).
  void onload(const Device& device, bool for_one_call = false);
  void offload();

  // The bytes of its weights that live in host memory of their own ("host_copy" above).
  size_t host_copy_bytes() const;
  // Moves each of those into `file`, one weight at a time (so the process never holds two
  // copies of more than one weight), and frees the host memory. Only while on the host.
  void spill_host_copies(SpillFile& file);

 private:
  std::string name_;
  std::vector<BufferPtr> buffers_;
  std::vector<void*> host_data_;  // each buffer's own bytes
  std::vector<Device> homes_;     // where those bytes are (host memory)
  std::vector<DType> dtypes_;     // each buffer's, as added
  std::vector<bool> spilled_;     // each buffer's own bytes were moved into a spill file
  size_t bytes_ = 0;
  bool resident_ = false;
  Device device_ = default_device();  // where it is while resident
};

// Where spill files go: KILN_SPILL_DIR; unset: kiln's cache folder (KILN_CACHE_DIR's default), or
// the system's temporary folder when that is off. Empty for KILN_SPILL_DIR=none (no spilling).
std::filesystem::path offload_spill_dir();

// While alive, weights loaded through nn::Weights on this thread are added to `component`.
class WeightCollector {
 public:
  explicit WeightCollector(ComponentWeights& component);
  ~WeightCollector();
  WeightCollector(const WeightCollector&) = delete;
  WeightCollector& operator=(const WeightCollector&) = delete;
  static ComponentWeights* active();

 private:
  ComponentWeights* previous_;
};

}  // namespace kiln
