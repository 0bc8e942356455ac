// One component of a random benchmark checkpoint (kiln make-random) as data: its folder, its
// config.json, its weights file name and shard limit, and every tensor with its shape and how
// its values are drawn (random_values.h). like_recipe.h builds these from what the model each
// config names reads (component_reads.h); write_random_component turns one into files.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/shape.h"
#include "io/safetensors_stream_writer.h"
#include "random_checkpoint/random_values.h"

namespace kiln::random_weights {

struct RandomTensor {
  std::string name;  // the Diffusers / transformers state-dict key
  Shape shape;
  Init init;
  // Stored in this dtype whatever the component's (a BatchNorm's int64 num_batches_tracked).
  std::optional<DType> dtype;
};

struct RandomComponent {
  std::string folder;        // "transformer", "text_encoder_2", ...
  nlohmann::json config;     // config.json (written with sorted keys, as save_pretrained does)
  std::string weights_base;  // "diffusion_pytorch_model" (Diffusers) or "model" (transformers)
  uint64_t max_shard_bytes;  // the shard limit of that library's save_pretrained
  std::vector<RandomTensor> tensors;

  int64_t parameters() const;
};

// The most blocks or layers one stack of a random folder may have (--blocks, --t5-layers,
// --text-encoder-layers): the real models have at most 57 (FLUX.1's 19+38 blocks count per
// stack), and each one is ~30 tensor descriptions built before the disk check, so a count of a
// million ran out of memory (bad_alloc) before that check could refuse it.
constexpr int64_t kMaxRandomLayers = 1000;

// Diffusers' save_pretrained default max_shard_size ("10GB"); transformers' ("5GB").
constexpr uint64_t kDiffusersShardBytes = 10'000'000'000ull;
constexpr uint64_t kTransformersShardBytes = 5'000'000'000ull;

// The standard deviation of every bias: small, so that a bias never dominates its layer.
constexpr double kBiasStd = 0.01;

// torch_dtype as transformers writes it into config.json ("bfloat16", "float16", "float32").
const char* torch_dtype_name(DType dtype);

// The tensors of `c` in `dtype` (or their own), each drawing its values from tensor_key(seed, folder/name);
// with `layout_only`, none has values (holes in the file: io::StreamedTensor::fill).
std::vector<io::StreamedTensor> streamed_tensors(const RandomComponent& c, DType dtype, uint64_t seed,
                                                 bool layout_only = false);

struct WrittenComponent {
  std::string folder;
  int64_t tensors = 0;
  int64_t parameters = 0;
  uint64_t bytes = 0;              // every file: config.json, weights, index
  std::vector<std::string> files;  // in the component folder
};

// What write_random_component would write (names and sizes), without writing.
WrittenComponent plan_random_component(const RandomComponent& c, DType dtype);
// Writes DIR/FOLDER/config.json and the weights (sharded at c.max_shard_bytes) in `dtype`.
// DIR/FOLDER is created; it should be new (see safetensors_shards.h on errors).
WrittenComponent write_random_component(const std::filesystem::path& dir, const RandomComponent& c, DType dtype,
                                        uint64_t seed, bool layout_only = false);

}  // namespace kiln::random_weights
