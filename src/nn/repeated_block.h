// What the repeated blocks of the diffusion transformers (FLUX.1's double- and single-stream
// blocks, SD3's JointTransformerBlock) share: their dims, with the head count taken from the
// (possibly tensor-parallel) projection widths, and their compiled form for
// compile_repeated_blocks (runtime.md §5).
#pragma once
#include <memory>

#include "exec/compile.h"

namespace kiln::nn {

// The dims a block needs. Heads are inferred from the projection width / head_dim at run
// time (runtime.md §6.6) so the same code runs with all heads or a tensor-parallel share.
struct BlockDims {
  int64_t dim = 0;       // D = heads * head_dim
  int64_t head_dim = 0;  // hd
  int64_t mlp_hidden = 0;  // 4 D
};

// What a repeated block shares with compiled mode (runtime.md §5): calls go through its
// CompiledFunction once compile() was called; the block's tensors are the executable's runtime
// arguments (parameters()), so every block of the same structure runs one shared executable.
// The executable's args are (x, c, temb, rope.cos, rope.sin, rope.pair_sign).
class CompilableBlock {
 public:
  bool is_compiled() const { return compiled_ != nullptr; }
  const CompiledFunction* compiled() const { return compiled_.get(); }

 protected:
  std::shared_ptr<const CompiledFunction> compiled_;
};

// [B, S, H*hd] -> [B, S, H, hd]; the head count follows the (possibly sharded) width.
inline Tensor split_heads(const Tensor& x, int64_t head_dim) {
  return reshape(x, {x.dim(0), x.dim(1), -1, head_dim});
}

}  // namespace kiln::nn
