// Tensor-parallel plan entries (distributed/tensor_parallel.h) for the modules the diffusion
// transformers share, by their Diffusers module names, so each model's tp_plan lists only what
// is its own. Colwise producers feed rowwise consumers: one all-reduce per rowwise Linear, and
// attention is split by whole heads (Q, K and V colwise; per-head norms stay replicated).
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

#include "distributed/tensor_parallel.h"

namespace kiln::nn {

using TensorParallelPlan = std::vector<TensorParallelEntry>;

// Attention under `attn` ("transformer_blocks.*.attn2"): to_q, to_k, to_v colwise, to_out.0 rowwise.
TensorParallelPlan self_attention_plan(const std::string& attn);
// Joint (MMDiT) attention: self_attention_plan, and the text stream's add_q_proj, add_k_proj,
// add_v_proj colwise and to_add_out rowwise.
TensorParallelPlan joint_attention_plan(const std::string& attn);
// Diffusers' FeedForward under `ff`: net.0.proj colwise, net.2 rowwise.
TensorParallelPlan feed_forward_plan(const std::string& ff);
// `linears` colwise with their outputs all-gathered: the AdaLN modulations, sharded on request
// (TensorParallelConfig::shard_modulation) because every rank needs their whole output.
TensorParallelPlan gathered_plan(std::initializer_list<const char*> linears);

// The parts in order, as one plan.
TensorParallelPlan concat_plans(std::initializer_list<TensorParallelPlan> parts);

}  // namespace kiln::nn
