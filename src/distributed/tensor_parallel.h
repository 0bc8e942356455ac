// Tensor parallelism configuration: a device mesh (1-D now;
// the type keeps a list of dims so N-D meshes fit later), the config models take in
// from_pretrained, and a model's plan as data, like Diffusers' _tp_plan.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace kiln {

// Ranks arranged in a grid; 1-D today (one dim, "tp").
class DeviceMesh {
 public:
  explicit DeviceMesh(std::shared_ptr<ProcessGroup> group);
  const std::shared_ptr<ProcessGroup>& group() const { return group_; }
  int size() const { return group_->size(); }
  int rank() const { return group_->rank(); }
  const std::vector<int>& shape() const { return shape_; }

 private:
  std::shared_ptr<ProcessGroup> group_;
  std::vector<int> shape_;
};

struct TensorParallelConfig {
  DeviceMesh mesh;
  // Also shard the AdaLN modulation linears (colwise, outputs all-gathered):
  // they are ~27% of FLUX.1's parameters, replicated otherwise.
  bool shard_modulation = true;
};

// One entry of a model's plan: a module path pattern where "*" stands for any one path segment
// (a block index), and its style:
//  - colwise: the Linear's output features are split, rank r keeps rows [r·N/ws, (r+1)·N/ws);
//  - rowwise: its input features are split (columns), the partial products are summed with one
//    all_reduce, then the (replicated) bias is added;
//  - packed_colwise / packed_rowwise: the same within each block of the packed dimension, whose
//    sizes are proportional to `blocks` (proj_out reading [attn (D) | mlp (4D)]: {1, 4});
//  - colwise_gather (kiln's own): colwise, then an all_gather of the outputs, for layers whose
//    result every rank needs whole (the AdaLN modulation; the optional sharding);
//  - vocab_parallel (kiln's own, for nn::Embedding): rows of the table split, lookups summed with
//    one all_reduce (a text encoder's token embedding: ~12% of Qwen3-4B's first 27 layers).
struct TensorParallelEntry {
  std::string pattern;
  std::string style;
  std::vector<int64_t> blocks;
};

// A model's plan for one rank of one mesh.
struct ShardPlan {
  std::vector<TensorParallelEntry> entries;
  std::shared_ptr<ProcessGroup> group;
  // The entry whose pattern matches `path` ("transformer_blocks.3.attn.to_q"), or null
  // (replicated). Unknown styles are rejected when the plan is made.
  const TensorParallelEntry* find(const std::string& path) const;
  static std::shared_ptr<const ShardPlan> make(std::vector<TensorParallelEntry> entries, const DeviceMesh& mesh);
};

}  // namespace kiln
