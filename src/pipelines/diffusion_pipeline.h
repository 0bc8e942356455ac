// DiffusionPipeline: what every text-to-image pipeline shares,
// as Diffusers' DiffusionPipeline base: the components listed in model_index.json, where their
// weights live (host, to(device), model CPU offload in model_cpu_offload_seq order:
// pipeline_placement.cc), the fail-fast memory estimate of a call (pipeline_memory.cc), the size
// checks and the stage bookkeeping of __call__.
// A concrete pipeline (FluxPipeline, StableDiffusion3Pipeline) declares its components and
// its call; DiffusionPipeline::from_pretrained builds the class model_index.json names.
#pragma once
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "exec/compile.h"
#include "nn/diffusion_transformer.h"
#include "pipelines/call_arguments.h"
#include "pipelines/component_activations.h"
#include "pipelines/memory_estimate.h"
#include "pipelines/pipeline_options.h"
#include "pipelines/pipeline_output.h"

namespace kiln {

class AutoencoderKL;
struct PipelineState;

// How a pipeline's denoiser is compiled: the whole transformer, or
// compile_repeated_blocks (one executable per block structure).
enum class CompileScope { kFull, kRepeatedBlocks };

class DiffusionPipeline {
 public:
  // Reads `dir`/model_index.json and loads the pipeline class its _class_name names (one of
  // supported_classes(); any other is an error listing them).
  static std::unique_ptr<DiffusionPipeline> from_pretrained(const std::filesystem::path& dir,
                                                            const PipelineOptions& options = {});
  static const std::vector<std::string>& supported_classes();

  virtual ~DiffusionPipeline();

  virtual const char* class_name() const = 0;
  // A step-distilled checkpoint, made for few steps without guidance (FLUX.1-schnell: a FLUX.1
  // transformer without a guidance embedder; FLUX.2 klein with is_distilled). Diffusers' call
  // keeps its 28-step default for them; kiln's command line and server run kDistilledSteps
  // unless the steps are given.
  virtual bool step_distilled() const { return false; }
  static constexpr int64_t kDistilledSteps = 4;
  // __call__: checks the arguments and the memory the call needs before any work (failing
  // with the numbers and what would fit), then runs the pipeline's stages.
  PipelineOutput operator()(const PipelineCallArgs& args) const;

  // ---- where the weights live ----
  // By default the weights stay on the host (the mmapped checkpoint) and the CPU device reads
  // them in place: device memory holds only activations.
  // to(device): every component's weights are copied into device memory now (fails fast, naming
  // each component's size, when they exceed the device's capacity).
  DiffusionPipeline& to(const Device& device);
  // Model CPU offload: a component's weights are copied to the device when it is first called
  // in model_cpu_offload_seq order and released when the next one starts; the transformer
  // stays for all steps; everything is released at the end of each call. Device peak = the
  // largest component + its activations.
  DiffusionPipeline& enable_model_cpu_offload(const Device& device = default_device());
  // The model components in model_cpu_offload_seq order (Diffusers' attribute, as a list; only
  // those this checkpoint has).
  std::vector<std::string> model_cpu_offload_seq() const;
  // The device memory a call with these arguments needs under the current placement, per
  // component (weights exactly, activations as traced; nothing runs). operator() checks it
  // before any work. With args.vae_tiling kAuto the plan is for the decode the call would run:
  // untiled when that fits the device's memory, else tiled (MemoryEstimate::vae_tile_size).
  MemoryEstimate estimate_memory(const PipelineCallArgs& args) const;
  // The plan with the VAE decoding untiled (0) or in tiles of vae_tile_size image pixels.
  MemoryEstimate estimate_memory(const PipelineCallArgs& args, int64_t vae_tile_size) const;
  // The VAE decode's peak activation bytes for latents of h × w (the plan's entry for the VAE),
  // untiled or in tiles of vae_tile_size image pixels: traced op by op up to `traced_tiles`
  // tiles; past that an upper bound from traces of one tile of each shape
  // (AutoencoderKL::tiled_decode_peak_bound), so the plan takes the same time at any size.
  static constexpr int64_t kTracedTiles = 64;
  size_t decode_activation_bytes(int64_t h, int64_t w, int64_t vae_tile_size,
                                 int64_t traced_tiles = kTracedTiles) const;
  // With the weights read in place from the host (no offload, no to(device)), each component's
  // mapped weights are read while it runs, the transformer's at every step: a component whose
  // weights plus activations exceed the machine's memory (`physical_total`) would be re-read from
  // disk page by page. The fail-fast message for that — what each component needs and what would
  // run it — or std::nullopt when every component fits. operator() checks it before any work
  // (KILN_HOST_MEMORY_CHECK=0 skips it).
  std::optional<std::string> host_working_set_misfit(const MemoryEstimate& e, size_t physical_total) const;
  const std::vector<OffloadEvent>& offload_events() const;
  void clear_offload_events();

  // The denoiser's weights under their state-dict keys, as held (quantized ones in their storage
  // type): what kiln convert writes.
  const nn::NamedParameters& transformer_parameters() const;

  // ---- compiled mode ----
  // Compiles the denoiser as pipe.transformer.compile() / compile_repeated_blocks() would.
  void compile_transformer(CompileScope scope, const CompileOptions& options = {});
  // Traces and compiles the transformer executables a call at this size would use, without
  // running anything, so serving never compiles on a request (kiln warmup). Sizes are rounded
  // as operator() rounds them; max_sequence_length std::nullopt: the pipeline's default. Needs
  // a compiled transformer.
  void warmup(int64_t height, int64_t width, std::optional<int64_t> max_sequence_length = std::nullopt) const;

  int64_t vae_scale_factor() const;
  // Image sides must be multiples of this (the VAE's scale factor times the patch size).
  int64_t size_multiple() const { return vae_scale_factor() * patch_size(); }
  virtual int64_t default_sample_size() const = 0;
  // The dtype each model component was loaded in (after "auto" was resolved), in
  // model_cpu_offload_seq order.
  std::vector<std::pair<std::string, DType>> dtypes() const;
  // The bytes of every weight each component holds, by dtype and by where they live now
  // (mapped checkpoint file, host copy, device), in model_cpu_offload_seq order.
  struct WeightBytes {
    std::string component;
    std::map<std::string, size_t> by_dtype, by_place;
  };
  std::vector<WeightBytes> weight_bytes() const;
  double load_seconds() const;
  const std::filesystem::path& model_dir() const;

 protected:
  // A tensor the caller gave (initial latents) on the pipeline's device, copied there when it is
  // elsewhere (Diffusers: latents.to(device)).
  Tensor on_device(const Tensor& t) const;
  // The loaded components and their placement (pipelines/pipeline_state.h), from PipelineLoader,
  // and the denoiser and VAE every pipeline has, for what the base does with them the same way
  // (they live in the concrete pipeline's heap-held models, so a move keeps them where they are).
  DiffusionPipeline(std::unique_ptr<PipelineState> state, nn::DiffusionTransformer& denoiser,
                    const AutoencoderKL& vae);
  // Moved only as the concrete class (a base reference could otherwise take another class's state).
  DiffusionPipeline(DiffusionPipeline&&) noexcept;
  DiffusionPipeline& operator=(DiffusionPipeline&&) noexcept;

  // While alive: the pipeline's components are this caller's (one call at a time), and under
  // model offload every component is released at its end, also when the work fails. operator()
  // holds one; so does any public method that runs components outside it.
  class CallGuard {
   public:
    explicit CallGuard(const DiffusionPipeline& pipe);
    ~CallGuard();
    CallGuard(const CallGuard&) = delete;
    CallGuard& operator=(const CallGuard&) = delete;

   private:
    const DiffusionPipeline& pipe_;
    std::lock_guard<std::mutex> lock_;
    DefaultDeviceGuard on_device_;  // what a call makes (noise, ids, tables) is made on the pipeline's device
  };

  // ---- what a concrete pipeline provides ----
  nn::DiffusionTransformer& denoiser() { return *denoiser_; }
  const nn::DiffusionTransformer& denoiser() const { return *denoiser_; }
  const AutoencoderKL& vae() const { return *vae_; }
  virtual int64_t patch_size() const = 0;
  // A size that is not a multiple of size_multiple(): rounded down with a warning (FluxPipeline,
  // as Diffusers), or an error (StableDiffusion3Pipeline's check_inputs).
  virtual bool rounds_sizes() const { return true; }
  // The T5 length a call uses (its default when not given), checked against the pipeline's limit.
  virtual int64_t max_sequence_length(const PipelineCallArgs& args) const = 0;
  // Argument checks and warnings (prompt cuts) before the memory check; `out.warnings` collects them.
  virtual void check_call(const PipelineCallArgs& args, int64_t height, int64_t width, PipelineOutput& out) const = 0;
  // The peak activation bytes of each model component's forward at these sizes (latent h × w),
  // by component name, traced without running anything (trace_peak_bytes).
  virtual ComponentActivations trace_activations(int64_t h, int64_t w, int64_t max_sequence_length,
                                                 int64_t vae_tile_size) const = 0;
  // Bytes the pipeline keeps across components (embeddings, latents, ids, tables) for this call
  // (`args`: a negative prompt's embeddings are kept too when guidance needs them).
  virtual size_t carried_bytes(const PipelineCallArgs& args, int64_t h, int64_t w,
                               int64_t max_sequence_length) const = 0;
  // Host bytes a call needs whatever the placement (noise, latents, tables, the image).
  virtual double host_floor_bytes(int64_t height, int64_t width, int64_t max_sequence_length) const = 0;
  virtual void warmup_transformer(int64_t h, int64_t w, int64_t max_sequence_length) const = 0;
  // The stages of __call__ after the checks, sized (height, width multiples of size_multiple()).
  struct Sized {
    int64_t height, width, max_sequence_length, vae_tile_size;
  };
  virtual void run(const PipelineCallArgs& args, const Sized& sized, PipelineOutput& out) const = 0;

  // ---- what run() uses ----
  // The offload hook before `component` runs: every other component leaves the device,
  // then it arrives (if not there already). A no-op unless model offload is on.
  void use(const std::string& component) const;
  // The VAE decode of latents z [1, C, h, w], tiled when vae_tile_size > 0.
  Tensor decode(const Tensor& z, int64_t vae_tile_size) const;
  const std::filesystem::path& dir() const;
  // The profile and memory bookkeeping of the stages: each model component's launches count for
  // it (exec/profile.h), and the allocator's cached blocks of the finished component are returned.
  class Stages {
   public:
    explicit Stages(const DiffusionPipeline& pipe);
    ~Stages();
    void next(const char* component);  // the next component's work starts
    void end();                        // no component's
   private:
    const DiffusionPipeline& pipe_;
    struct Scope;
    std::unique_ptr<Scope> scope_;
  };

  // The end of denoising step i of n, with `latents` its result and t0 its start: in deferred
  // mode the step's graph is complete (the same fingerprint every step); waits for the latents
  // (per-step timing and progress; the next step needs them anyway), fails naming the step when
  // they hold NaN/Inf, and reports the step's seconds.
  void finish_step(int64_t i, const Tensor& latents, std::chrono::steady_clock::time_point t0,
                   const PipelineCallArgs& args, PipelineOutput& out) const;
  // The decode stage: the VAE's input is latents() / scaling_factor + shift_factor (latents()
  // runs inside the stage, so its ops count for the VAE), decoded (tiled when vae_tile_size > 0),
  // checked finite and postprocessed into out.image.
  void decode_image(const std::function<Tensor()>& latents, int64_t vae_tile_size, Stages& stages,
                    const PipelineCallArgs& args, PipelineOutput& out) const;
  // Peak bytes of a forward, traced (nothing runs): f's recorded ops' liveness.
  static size_t trace_peak_bytes(const char* what, const std::function<Tensor()>& f);

  std::unique_ptr<PipelineState> s_;

 private:
  nn::DiffusionTransformer* denoiser_;
  const AutoencoderKL* vae_;
  size_t memory_limit() const;
  size_t physical_available() const;
  ComponentActivations activations(int64_t h, int64_t w, int64_t max_sequence_length, int64_t vae_tile_size) const;
  // The tile the call asks for (vae_tile_size, else the VAE's sample_size), checked.
  int64_t requested_vae_tile(const PipelineCallArgs& args) const;
  // Tile sizes must be multiples of this (4 latent pixels); check_vae_tile_size fails naming
  // vae_tile_size (--vae-tile-size) and the accepted range otherwise.
  int64_t vae_tile_multiple() const;
  void check_vae_tile_size(int64_t tile) const;
  // The call's (height, width): as given, else default_sample_size × vae_scale_factor; and that
  // rounded down to multiples of size_multiple().
  std::pair<int64_t, int64_t> requested_size(const PipelineCallArgs& args) const;
  std::pair<int64_t, int64_t> rounded_size(const PipelineCallArgs& args) const;
  void onload(size_t i) const;
  void offload(size_t i) const;
  void free_all() const;
  std::string memory_misfit(const MemoryEstimate& e, const PipelineCallArgs& args) const;
};

}  // namespace kiln
