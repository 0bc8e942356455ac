// PipelineOptions: how DiffusionPipeline::from_pretrained loads a pipeline (Diffusers'
// from_pretrained keyword arguments: the device, torch_dtype, per-component files, and kiln's
// tensor parallelism, quantization and strictness).
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "distributed/tensor_parallel.h"

namespace kiln {

// A phase of a pipeline's work that can take seconds on real checkpoints, as progress: a
// component's load (quantizing or converting its weights included), its onload under model
// offload, and the start of its work in a call. `seconds` < 0: it starts; else it took that long.
struct PipelineProgress {
  std::string phase;      // "load", "onload", "run"
  std::string component;  // "transformer", "text_encoder_2", ...
  std::string detail;     // "from flux1-schnell.gguf", "quantizing to q8_0"; "" for none
  double seconds = -1;
};

struct PipelineOptions {
  Device device = default_device();
  // Tensor parallelism: the transformer is sharded over the mesh (each rank
  // loads only its slices); text encoders and VAE are replicated; every rank runs the pipeline.
  std::optional<TensorParallelConfig> tensor_parallel;
  // A checkpoint tensor no model reads (beyond those it skips on purpose) is an error, not a
  // warning (--strict).
  bool strict = false;
  // Called with each load warning (unused checkpoint tensors).
  std::function<void(const std::string&)> on_warning;
  // Called as each phase PipelineProgress names starts and ends (load here; onload and run in
  // every call of the pipeline).
  std::function<void(const PipelineProgress&)> on_progress;
  // Diffusers' torch_dtype: the dtype every component's weights are held in and
  // its activations computed in. std::nullopt is "auto": each component's checkpoint dtype, so
  // a bf16 checkpoint runs in bf16 with its weights read in place and never widened. f32 is the
  // reference path (a bf16 checkpoint's weights are then converted once, at load).
  std::optional<DType> dtype;
  // Per-component choice (a model component of the pipeline, e.g. "text_encoder_2",
  // "transformer"; std::nullopt: auto), over `dtype`.
  std::map<std::string, std::optional<DType>> component_dtype;
  // FLUX.2: the text encoder's hidden layers calls will read (Diffusers' text_encoder_out_layers;
  // empty: the pipeline's default). Only the decoder layers these need are loaded and run.
  std::vector<int64_t> text_encoder_out_layers;
  // Quantization at load (--quantize), by component: its float linear weights are quantized into
  // the given storage type (core/quant_blocks.h) once, at load (nn::Weights::with_quantization).
  std::map<std::string, DType> quantize;
  // A checkpoint file that replaces a component's weights (--transformer FILE, ...): safetensors
  // or GGUF, in Diffusers names or an original single-file layout; the component's config still
  // comes from the pipeline folder.
  std::map<std::string, std::filesystem::path> component_files;
};

}  // namespace kiln
