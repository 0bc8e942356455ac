// Turning a graph into launches and running it: the part deferred-and-fused mode (and, later,
// compiled mode) share. compile_graph() partitions a canonical graph into launch groups
// (graph/fusion.h) once; run_graph() binds input tensors, allocates one buffer per group
// result (never one for a fused intermediate) and enqueues one kernel per group on the
// device queue. It does not wait.
#pragma once
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "graph/fusion.h"
#include "exec/memory_plan.h"
#include "graph/graph.h"

namespace kiln {

struct CompiledGraph {
  Graph graph;  // canonical
  std::vector<LaunchGroup> groups;
  // release_after[i]: values no group after i reads (and that are not outputs). run_graph drops
  // its handles to them once group i is enqueued, so their buffers return to the pool as soon
  // as the queued kernels finish, as in strict eager, instead of living until the graph ends.
  std::vector<std::vector<int>> release_after;
  // Compiled mode: one arena per run holds every intermediate at a planned offset (empty: one
  // pooled buffer per launch result, as deferred mode runs).
  MemoryPlan memory;
  double compile_seconds = 0;
  int launches() const;  // kernels one run enqueues (views, aliases and assembled concats launch nothing)
  int buffers() const;   // device buffers one run allocates: one per launch, except launches that
                         // write into a concat's buffer, plus those concat buffers
};

// Partitions under `limits` as far as the graph's device allows (DeviceRuntime::
// fused_tiles_hold_whole_rows), then finishes as below.
std::shared_ptr<const CompiledGraph> compile_graph(Graph canonical, const FusionLimits& limits = {},
                                                   bool plan_memory = false);
// The part of compile_graph after partitioning (kernel checks, liveness, the memory plan): also
// what a graph loaded from the persistent cache goes through.
std::shared_ptr<const CompiledGraph> finish_compiled_graph(Graph canonical, std::vector<LaunchGroup> groups,
                                                           bool plan_memory);

// One line per group: launch name (or view/alias/assembled), what it reads, the result's shape,
// and where it writes (for logs: KILN_DEFER_LOG=2).
std::string describe_launches(const CompiledGraph& compiled);

// `inputs[i]` binds graph input i (shape/dtype/strides must match). Returns one tensor per
// graph output: dense, offset 0, freshly computed (an output that is a graph input, or a view,
// is copied so the caller can treat every result as a value it owns).
// Queued work keeps `compiled` alive, so a cache may drop it at any time.
// With dense_outputs=false (compiled mode) an output that is a view of a launch result or a graph
// input is returned as that view, without a copy.
// `weights[i]` (compiled mode with CompileOptions::prepack_weights): input i is a module weight,
// so the multi-row linears reading it read a pre-packed copy (DeviceRuntime::prepared_linear_weight).
std::vector<Tensor> run_graph(const std::shared_ptr<const CompiledGraph>& compiled, const std::vector<Tensor>& inputs,
                              bool dense_outputs = true, const std::vector<bool>& weights = {});

}  // namespace kiln
