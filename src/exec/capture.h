// Capture (compiled mode): running a callable once with every op recorded
// into a private pending graph that is never flushed, to get the whole computation as one graph.
// It shares the deferred-mode recorder (exec/deferred.cc): same nodes, same canonical form.
//
// While a capture is active on a thread, every op records (in any eager mode); a host read of
// a captured value is a graph break, raised as GraphBreak naming the op that produced the value
// and the module path it was recorded in (ModuleScope). Tensors computed outside the capture
// (weights, inputs, constants) become graph inputs; a pending value of the thread's deferred
// graph is materialised first.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "graph/graph.h"

namespace kiln {

// A host read inside a captured region.
class GraphBreak : public Error {
 public:
  using Error::Error;
};

// Names the module a stretch of code belongs to ("transformer_blocks.3"); nested scopes join
// with '.'. Captured nodes remember the path, so a graph break can say where it happened.
class ModuleScope {
 public:
  explicit ModuleScope(const std::string& name);
  ModuleScope(const std::string& name, int64_t index) : ModuleScope(name + "." + std::to_string(index)) {}
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
  static std::string current();  // the joined path ("" at top level)
};

// An input with this shape and dtype whose contents are never read (traces, warmup, memory
// estimates): host memory, so it never counts against a device's budget.
Tensor placeholder_tensor(const Shape& shape, DType dtype);

namespace detail {

struct Captured {
  Graph graph;                  // canonical (passes.h)
  std::vector<Tensor> inputs;   // canonical input i was this tensor (a view, with canonical unit strides)
  std::vector<int> output_index;  // returned tensor k is canonical output output_index[k]
  size_t nodes_recorded = 0;
  // Every recorded node in the order the callable issued it (dead ones too; outputs = the
  // returned tensors): what an op-by-op run would allocate, in its order (memory estimates).
  Graph recorded;
};

// Whether a capture is active on this thread (ops record, whatever the eager mode).
bool capturing();
// Runs `fn` under a fresh capture and returns its graph. `what` names the callable in errors.
// Nested captures are refused (a compiled callable called inside another's trace is inlined by
// its caller instead). Throws GraphBreak on a host read of a captured value, on a host read of
// one of `runtime_inputs` (tensors whose values change between calls: the callable's args and
// parameters, each with a name for the message), and on synchronize() inside the region.
Captured capture(const std::string& what, const std::function<std::vector<Tensor>()>& fn,
                 const std::vector<std::pair<Tensor, std::string>>& runtime_inputs = {});
// Called by every host read (exec/host.h) and synchronize(): throws GraphBreak when a capture
// is active and `t` (or, for a null tensor, any sync) may not be read inside it.
void check_host_read(const Tensor* t);

}  // namespace detail
}  // namespace kiln
