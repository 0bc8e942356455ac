// What the repeated blocks of the diffusion transformers (FLUX.1's double- and single-stream
// blocks, SD3's JointTransformerBlock) share: their dims, with the head count taken from the
// (possibly tensor-parallel) projection widths, and their compiled form for
// compile_repeated_blocks, which reads a model's repeated_blocks() list.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exec/compile.h"
#include "exec/ops.h"
#include "nn/weights.h"

namespace kiln::nn {

// The dims a block needs. Heads are inferred from the projection width / head_dim at run
// time so the same code runs with all heads or a tensor-parallel share.
struct BlockDims {
  int64_t dim = 0;       // D = heads * head_dim
  int64_t head_dim = 0;  // hd
  int64_t mlp_hidden = 0;  // 4 D
};

// What a repeated block shares with compiled mode: calls go through its
// CompiledFunction once compile() was called; the block's tensors, by their state-dict keys
// relative to the block (recorded when load_block built it), are the executable's runtime
// arguments, so every block of the same structure runs one shared executable.
class CompilableBlock {
 public:
  virtual ~CompilableBlock() = default;
  // Diffusers' class name (what a model's repeated_blocks() lists).
  virtual const char* class_name() const = 0;
  virtual void compile(const CompileOptions& options) = 0;
  bool is_compiled() const { return compiled_ != nullptr; }
  const CompiledFunction* compiled() const { return compiled_.get(); }
  // Every tensor forward reads besides its args: the recorded parameters, in key order.
  std::vector<Tensor> parameters() const { return parameter_values(named_); }
  const NamedParameters& named_parameters() const { return named_; }

 protected:
  std::shared_ptr<const CompiledFunction> compiled_;

 private:
  template <typename Block, typename... Args>
  friend void load_block(std::vector<Block>& blocks, const Weights& w, Args&&... args);
  NamedParameters named_;
};

// Builds a block from its checkpoint view `w` ("transformer_blocks.3") at the end of `blocks`,
// recording the weights it reads as its parameters.
template <typename Block, typename... Args>
void load_block(std::vector<Block>& blocks, const Weights& w, Args&&... args) {
  ParameterRecorder recorded;
  blocks.emplace_back(w, std::forward<Args>(args)...);
  static_cast<CompilableBlock&>(blocks.back()).named_ = recorded.named(w.path());
}

// Diffusers' compile_repeated_blocks: every block whose class `repeated` (the model's
// repeated_blocks()) lists is compiled in place. An error naming `model` when there is none
// (Diffusers' ValueError).
void compile_repeated_blocks(const std::string& model, const std::vector<std::string>& repeated,
                             const std::vector<CompilableBlock*>& blocks, const CompileOptions& options);

// [B, S, H*hd] -> [B, S, H, hd]; the head count follows the (possibly sharded) width.
inline Tensor split_heads(const Tensor& x, int64_t head_dim) {
  return reshape(x, {x.dim(0), x.dim(1), -1, head_dim});
}

}  // namespace kiln::nn
