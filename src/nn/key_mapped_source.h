// Single-file checkpoints in their original key layouts (FLUX.1 / FLUX.2 in BFL's names, SD3 in
// Stability's, the LDM VAE), read by kiln's models in Diffusers names: a KeyMappedSource wraps
// the file's source and presents the Diffusers state dict the family's key map
// (io/key_map.h) derives from it, without copying: split rows of a fused tensor are views of
// it, and only a swap of row halves makes a new buffer.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "io/gguf.h"
#include "io/key_map.h"
#include "nn/weight_source.h"

namespace kiln::nn {

class KeyMappedSource final : public WeightSource {
 public:
  // `original`: the file's source; `prefix` is taken off its keys ("model.diffusion_model."),
  // and keys without it (other components of a full checkpoint) are not this source's. Errors
  // (kiln::Error naming the file and the tensor) when the map leaves a tensor unmatched or a
  // block lacks one it needs (io::resolve_key_map).
  KeyMappedSource(std::shared_ptr<const WeightSource> original, const io::KeyMap& map, std::string prefix = "");

  // The file, the layout and the prefix: "flux1-dev.safetensors (FLUX.1 (BFL layout))".
  std::string describe() const override;
  bool contains(const std::string& key) const override { return tensors_.count(key) != 0; }
  Shape shape(const std::string& key) const override { return at(key).shape; }
  std::optional<DType> stored_dtype(const std::string& key) const override;
  // A split part is a view of the loaded original tensor (whole rows, so block-quantized types
  // too); a squeezed 1x1 convolution is a view; swapped halves are one new buffer.
  Tensor load(const std::string& key, DType dtype) const override;
  // Row slices of a split part read only their rows; column slices read those columns of the
  // whole original tensor; swapped and squeezed tensors are sliced from a whole load.
  Tensor load_slice(const std::string& key, int dim, int64_t start, int64_t length, DType dtype) const override;
  std::vector<std::string> names() const override;  // Diffusers keys, sorted
  // Original keys (without the prefix) with a Diffusers tensor not read yet: a fused qkv counts
  // as read once its three parts are. (Without the prefix, so a model's not-loaded prefixes —
  // AutoencoderKL's "encoder.", "quant_conv." — apply as they do to Diffusers names.)
  std::vector<std::string> unread() const override;

  const std::string& prefix() const { return prefix_; }
  const std::string& map_name() const { return map_name_; }
  // Where a Diffusers tensor lies in the file (tests, kiln inspect).
  const io::MappedTensor& mapping(const std::string& key) const { return at(key); }

 private:
  const io::MappedTensor& at(const std::string& key) const;
  void mark_read(const std::string& key) const;

  std::shared_ptr<const WeightSource> original_;
  std::string prefix_;
  std::string map_name_;
  std::map<std::string, io::MappedTensor> tensors_;          // Diffusers key -> place
  std::map<std::string, std::vector<std::string>> parts_;    // original key -> its Diffusers keys
  mutable std::mutex mu_;
  mutable std::set<std::string> read_;  // Diffusers keys
  // The last load of each split original tensor (per dtype), while a part still holds it.
  struct Loaded {
    std::weak_ptr<Buffer> buffer;
    int64_t offset = 0;
    DType dtype = DType::f32;
  };
  mutable std::mutex loaded_mu_;
  mutable std::map<std::pair<std::string, DType>, Loaded> loaded_;
};

// The inverse: writes the Diffusers-named tensors of `diffusers` (a component's whole state dict)
// as a safetensors file in `map`'s original layout, every key after `prefix`, through
// io::write_safetensors_streamed (never a second copy of the checkpoint in memory). Values keep
// their stored dtype (f32, bf16, f16; storage-only types are refused, naming the tensor).
// Returns the file size. Errors name the tensor a rule cannot place (io::invert_key_map).
uint64_t write_original_layout(const WeightSource& diffusers, const io::KeyMap& map, const std::filesystem::path& path,
                               const std::string& prefix = "");
// The same as a GGUF file (io/gguf_writer.h) with `metadata`: tensors keep their stored type,
// quantized ones included (split parts of a fused tensor are whole rows, so their bytes are
// joined as they are); stable-diffusion.cpp and city96's loaders read FLUX.1 in this layout.
uint64_t write_original_layout_gguf(const WeightSource& diffusers, const io::KeyMap& map,
                                    const std::filesystem::path& path, const io::GgufMetadata& metadata,
                                    const std::string& prefix = "");

}  // namespace kiln::nn
