// FluxPipeline: text-to-image with a FLUX.1 checkpoint in Diffusers folder layout, step for
// step as diffusers.FluxPipeline.__call__ (flux1.md §6): CLIP pooled + T5 embeddings, packed
// latents, FlowMatchEuler schedule, the transformer per step, unpack, VAE decode.
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/tensor_parallel.h"

namespace kiln {

class FluxTransformer2DModel;

struct FluxPipelineOptions {
  Device device = Device::cpu();
  // Tensor parallelism (runtime.md §6): the transformer is sharded over the mesh (each rank
  // loads only its slices); text encoders and VAE are replicated; every rank runs the pipeline.
  std::optional<TensorParallelConfig> tensor_parallel;
  // A checkpoint tensor no model reads (beyond those it skips on purpose) is an error, not a
  // warning (--strict).
  bool strict = false;
  // Called with each load warning (unused checkpoint tensors).
  std::function<void(const std::string&)> on_warning;
  // Diffusers' torch_dtype (design.md §6): the dtype every component's weights are held in and
  // its activations computed in. std::nullopt is "auto": each component's checkpoint dtype, so
  // a bf16 checkpoint runs in bf16 with its weights read in place and never widened. f32 is the
  // reference path (a bf16 checkpoint's weights are then converted once, at load).
  std::optional<DType> dtype;
  // Per-component choice ("text_encoder", "text_encoder_2", "transformer", "vae"; std::nullopt:
  // auto), over `dtype`.
  std::map<std::string, std::optional<DType>> component_dtype;
};

// Tiled VAE decoding (Diffusers' pipe.vae.enable_tiling(), AutoencoderKL.tiled_decode).
enum class VaeTilingMode {
  kAuto,  // tiled only when the call's memory plan says the untiled decode does not fit
  kOn,    // always (latents larger than one tile)
  kOff,   // never
};

struct FluxCallArgs {
  std::string prompt;
  std::optional<std::string> prompt_2;  // T5 prompt; defaults to prompt
  std::optional<int64_t> height, width;  // default: default_sample_size * vae_scale_factor
  int64_t num_inference_steps = 28;
  double guidance_scale = 3.5;  // used only by guidance-distilled (dev) checkpoints
  int64_t max_sequence_length = 512;
  uint64_t seed = 0;  // torch.Generator("cpu").manual_seed(seed) noise, unless latents are given
  // Explicit initial noise: packed [1, L_img, 4C] or unpacked [1, C, h, w] (parity tests).
  Tensor latents;
  VaeTilingMode vae_tiling = VaeTilingMode::kAuto;
  // Diffusers' vae.tile_sample_min_size: image pixels per tile side (0: the VAE's sample_size,
  // 1024 for FLUX.1). kAuto starts from it and halves it until the plan fits.
  int64_t vae_tile_size = 0;
  // Called after every denoising step with (step index from 0, total steps, seconds of that step).
  std::function<void(int64_t, int64_t, double)> on_step;
  // Called at once with each warning (e.g. a size rounded down, a prompt cut), before the work starts.
  std::function<void(const std::string&)> on_warning;
  // Called when a stage other than the steps ends: ("encode" | "decode", seconds).
  std::function<void(const std::string&, double)> on_stage;
};

// One move of a component's weights (model offload, runtime.md §4.1.3), for reports and tests.
struct OffloadEvent {
  std::string component;  // "text_encoder", "text_encoder_2", "transformer", "vae"
  std::string action;     // "onload" or "offload"
  size_t bytes = 0;       // the component's weights
  double seconds = 0;     // the copy (onload) or release (offload)
  size_t device_in_use = 0;  // device bytes in use right after it
};

// What one call needs on the device (model offload's fail-fast check).
struct ComponentMemory {
  std::string name;
  size_t weight_bytes = 0;
  size_t activation_bytes = 0;  // peak of its forward run op by op, at the call's sizes
};
struct MemoryEstimate {
  std::vector<ComponentMemory> components;  // in model_cpu_offload_seq order
  std::string placement;                    // "host", "device" or "model offload"
  size_t carried_bytes = 0;  // what the pipeline keeps across components: embeddings, latents, ids, RoPE tables
  size_t required = 0;       // for that placement, carried bytes included
  // The VAE decode the plan is for: untiled (0), or tiles of this many image pixels per side.
  int64_t vae_tile_size = 0;
  size_t capacity = 0;                      // the device's (0 = unlimited)
  bool physical_limit = false;  // capacity is the memory the device can still get (none was set)
  bool fits() const { return capacity == 0 || required <= capacity; }
};

struct FluxTimings {
  double encode = 0, decode = 0, total = 0;
  std::vector<double> steps;
};

struct FluxOutput {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> image;  // RGB, row-major HWC
  Tensor latents;              // final packed latents [1, L_img, 4C]
  FluxTimings timings;
  std::vector<std::string> warnings;  // e.g. a size rounded down to a multiple of 16
  int64_t vae_tile_size = 0;          // the decode ran in tiles of this many image pixels (0: untiled)
};

class FluxPipeline {
 public:
  static FluxPipeline from_pretrained(const std::filesystem::path& dir, const FluxPipelineOptions& options = {});
  FluxPipeline(FluxPipeline&&) noexcept;
  FluxPipeline& operator=(FluxPipeline&&) noexcept;
  ~FluxPipeline();

  FluxOutput operator()(const FluxCallArgs& args) const;

  // The denoiser, for compiled mode as in Diffusers: pipe.transformer().compile(options) or
  // pipe.transformer().compile_repeated_blocks(options) (runtime.md §2.4, §5).
  FluxTransformer2DModel& transformer();

  // ---- where the weights live (runtime.md §3–4, design.md §4) ----
  // By default the weights stay on the host (the mmapped checkpoint) and the CPU device reads
  // them in place: device memory holds only activations.
  // to(device): every component's weights are copied into device memory now (fails fast, naming
  // each component's size, when they exceed the device's capacity).
  FluxPipeline& to(const Device& device);
  // Model CPU offload: a component's weights are copied to the device when it is first called
  // in model_cpu_offload_seq order (text_encoder -> text_encoder_2 -> transformer -> vae) and
  // released when the next one starts; the transformer stays for all steps; everything is
  // released at the end of each call. Device peak = the largest component + its activations.
  FluxPipeline& enable_model_cpu_offload(const Device& device = Device::cpu());
  // The device memory a call with these arguments needs under the current placement, per
  // component (weights exactly, activations as traced; nothing runs). operator() checks it
  // before any work and fails with the numbers and the options that would fit.
  // With args.vae_tiling kAuto the plan is for the decode the call would run: untiled when that
  // fits the device's memory, else tiled (MemoryEstimate::vae_tile_size).
  MemoryEstimate estimate_memory(const FluxCallArgs& args) const;
  // The plan with the VAE decoding untiled (0) or in tiles of vae_tile_size image pixels.
  MemoryEstimate estimate_memory(const FluxCallArgs& args, int64_t vae_tile_size) const;
  const std::vector<OffloadEvent>& offload_events() const;
  void clear_offload_events();
  // Traces and compiles the transformer executables a call at this size would use, without
  // running anything, so serving never compiles on a request (kiln warmup). Sizes are rounded
  // as operator() rounds them. Needs a compiled transformer.
  void warmup(int64_t height, int64_t width, int64_t max_sequence_length = 512) const;

  int64_t vae_scale_factor() const;
  // The dtype each component was loaded in (after "auto" was resolved), in
  // model_cpu_offload_seq order: text_encoder, text_encoder_2, transformer, vae.
  std::vector<std::pair<std::string, DType>> dtypes() const;
  // The bytes of every weight each component holds, by dtype and by where they live now
  // (mapped checkpoint file, host copy, device), in model_cpu_offload_seq order.
  struct WeightBytes {
    std::string component;
    std::map<std::string, size_t> by_dtype, by_place;
  };
  std::vector<WeightBytes> weight_bytes() const;
  int64_t default_sample_size() const { return 128; }
  double load_seconds() const;
  const std::filesystem::path& model_dir() const;

  // Packing of latents into 2x2 patch tokens and back (flux1.md §6.3).
  static Tensor pack_latents(const Tensor& latents);  // [B, C, h, w] -> [B, (h/2)(w/2), 4C]
  static Tensor unpack_latents(const Tensor& packed, int64_t h, int64_t w);
  static Tensor image_ids(int64_t h, int64_t w);  // [(h/2)(w/2), 3] rows (0, i, j)

 private:
  struct Components;
  explicit FluxPipeline(std::unique_ptr<Components> c);
  std::unique_ptr<Components> c_;
};

}  // namespace kiln
