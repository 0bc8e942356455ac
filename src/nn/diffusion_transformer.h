// DiffusionTransformer: what every diffusion transformer (FLUX.1's, SD3's, FLUX.2's) shares, as
// Diffusers' ModelMixin gives it to each: the load-time checks (the tensor-parallel head count,
// a checkpoint holding more than the config says), compile() and compile_repeated_blocks(),
// warm-up and the activation trace from one trace of the forward, and the named parameters.
// A model declares its repeated block classes, visits its blocks and gives its traced forward
// (the computation past the input checks and host-side tables, over the executable's args); its
// forward checks the inputs and calls run().
#pragma once
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "distributed/tensor_parallel.h"
#include "exec/compile.h"
#include "nn/repeated_block.h"
#include "nn/weights.h"

namespace kiln::nn {

class DiffusionTransformer {
 public:
  virtual ~DiffusionTransformer() = default;

  // Whole-model compile (torch.compile(transformer, fullgraph, dynamic=False)): forward runs one
  // executable per input signature (and per variant, see run_compiled()).
  void compile(const CompileOptions& options = {});
  // Regional compile: every block whose class repeated_blocks() lists is compiled in place; the
  // rest of forward runs in the active eager mode. One executable per block class and shape.
  void compile_repeated_blocks(const CompileOptions& options = {});
  bool is_compiled() const { return compiled_ != nullptr; }
  // compile() or compile_repeated_blocks() was called.
  bool any_compiled() const;

  // Every tensor forward reads besides its inputs, by its Diffusers state-dict key (what TP
  // plans and offload name), and their values in key order (the executable's runtime arguments).
  const NamedParameters& named_parameters() const { return named_parameters_; }
  std::vector<Tensor> parameters() const { return parameter_values(named_parameters_); }

  // Diffusers' class name and _repeated_blocks.
  virtual const char* class_name() const = 0;
  virtual const std::vector<std::string>& repeated_block_classes() const = 0;

 protected:
  DiffusionTransformer() = default;
  DiffusionTransformer(const DiffusionTransformer&) = default;
  DiffusionTransformer(DiffusionTransformer&&) noexcept = default;
  DiffusionTransformer& operator=(const DiffusionTransformer&) = default;
  DiffusionTransformer& operator=(DiffusionTransformer&&) noexcept = default;

  using Traced = std::function<std::vector<Tensor>(const std::vector<Tensor>& args)>;
  // The forward over the executable's args, as a callable that owns what it reads (a copy of the
  // modules: tensors are shared handles), so an executable outlives moves of the model.
  virtual Traced traced() const = 0;
  // The executable's argument names, for errors and reports.
  virtual std::vector<std::string> arg_names() const = 0;
  // Calls `f` on every block, in forward order.
  virtual void for_each_block(const std::function<void(CompilableBlock&)>& f) = 0;
  virtual void for_each_block(const std::function<void(const CompilableBlock&)>& f) const = 0;

  // After compile(): the forward's result on `args` from its executable. `variant` names a static
  // choice that changes the graph (SD3's skipped layers) and `make` its traced forward; "" is
  // traced()'s.
  std::vector<Tensor> run_compiled(const std::vector<Tensor>& args, const std::string& variant = "",
                                   const std::function<Traced()>& make = {}) const;
  // Traces and compiles the executables a forward on arguments of these shapes would use (the
  // whole model's, or every compiled block's as met while tracing the forward), running nothing.
  void warmup_with(const std::vector<Tensor>& placeholder_args) const;
  // Peak activation bytes of one forward on arguments of these shapes run op by op (the traced
  // graph's liveness): model offload's fail-fast estimate. Runs nothing.
  size_t activation_bytes_with(const std::vector<Tensor>& placeholder_args) const;

  // ---- load-time checks ----
  // Tensor parallelism shards attention by heads: the mesh must divide them.
  static void check_heads_divide(const TensorParallelConfig& tp, int64_t heads, const std::filesystem::path& config);
  // A checkpoint with more than the config says (another block, a guidance embedder) would load
  // "fine" and compute another model: an error naming the key and `what` the config says.
  void refuse_extra(const Weights& w, const std::string& key, const std::string& what) const;
  void set_named_parameters(NamedParameters named) { named_parameters_ = std::move(named); }

 private:
  const CompiledFunction& compiled_variant(const std::string& variant, const std::function<Traced()>& make) const;

  struct Compiled {
    CompileOptions options;
    std::mutex mu;
    std::map<std::string, std::shared_ptr<const CompiledFunction>> by_variant;
  };
  std::shared_ptr<Compiled> compiled_;
  NamedParameters named_parameters_;
};

}  // namespace kiln::nn
