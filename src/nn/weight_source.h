// Where a model's parameters come from. Models read them through nn::Weights, which talks to
// a WeightSource: a safetensors checkpoint (file, shard index or folder) in normal use, or
// any other provider of named tensors (generated test weights; later, a rank's shard).
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/thread_scope.h"

namespace kiln::nn {

// How a model reads a tensor: as a linear layer's weight (Weights::get_linear_weight), or
// otherwise (norms, biases, convolutions, embeddings, buffers).
enum class WeightUse { linear_weight, other };

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual std::string describe() const = 0;  // names the source in errors (a path)
  virtual bool contains(const std::string& key) const = 0;
  virtual Shape shape(const std::string& key) const = 0;  // key must exist
  // The dtype `key` is stored in (key must exist); nullopt when kiln has no such dtype or the
  // source cannot tell.
  virtual std::optional<DType> stored_dtype(const std::string& key) const {
    (void)key;
    return std::nullopt;
  }
  virtual Tensor load(const std::string& key, DType dtype) const = 0;
  // Rows (dim 0) or columns (dim 1) [start, start+length) of a 2-D tensor, or rows of a 1-D
  // one (tensor parallelism: a rank's shard). The default loads the whole tensor and copies the
  // slice; a checkpoint reads only the slice's bytes.
  virtual Tensor load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const;
  // Every key the source holds, and those no load or load_slice has read yet (for the unused
  // tensor check). A source that cannot tell returns nothing for both.
  virtual std::vector<std::string> names() const { return {}; }
  virtual std::vector<std::string> unread() const { return {}; }
  // Told, before a model reads `key`, the shape its config implies and how it reads it. A
  // checkpoint has its shapes already and ignores this; a source that becomes what the model
  // reads (random checkpoints: random_checkpoint/model_reads.h) records it here.
  virtual void expect(const std::string& key, const Shape& shape, WeightUse use) const {
    (void)key, (void)shape, (void)use;
  }
};

// torch_dtype="auto": the floating-point dtype that holds most of the source's weight bytes
// (f32 when it cannot tell); bytes of quantized weights count as bf16's.
DType stored_float_dtype(const WeightSource& source);

// Whether `key` starts with one of `prefixes` (a model's checkpoint_keys_not_loaded()).
bool key_under(const std::string& key, const std::vector<std::string>& prefixes);

// While alive, every checkpoint opened on this thread with open_checkpoint is remembered, so a
// loader can name the tensors the model it built never read (Diffusers warns about those; a
// strict load refuses them). `not_loaded` lists the key prefixes the model skips on purpose
// (e.g. the VAE encoder of a decode-only pipeline).
class CheckpointAudit : public ThreadScope<CheckpointAudit> {
 public:
  static CheckpointAudit* active() { return current(); }
  void opened(std::shared_ptr<const WeightSource> source);

  // "file: 'key', 'key', ... (N tensors)" for each opened checkpoint with unread keys outside
  // `not_loaded`; empty when every tensor was read.
  std::vector<std::string> unused(const std::vector<std::string>& not_loaded) const;

 private:
  std::vector<std::shared_ptr<const WeightSource>> sources_;
};

// A safetensors checkpoint (a file, a *.safetensors.index.json, or a folder holding one), or a
// GGUF file: one named *.gguf or starting with the magic "GGUF" (io::has_gguf_magic).
std::shared_ptr<const WeightSource> open_checkpoint(const std::filesystem::path& path);

}  // namespace kiln::nn
