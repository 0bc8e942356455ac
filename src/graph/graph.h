// The pending-graph IR of deferred-and-fused mode: what the recorder
// builds instead of running ops, and what the passes (passes.h) and the fuser (fusion.h)
// work on. Pure metadata: no tensor is referenced, so a graph can be hashed and cached.
//
// Values are numbered densely: value id v < inputs.size() is graph input v, any other id is
// the result of node (v - inputs.size()). Host scalars are 0-d inputs like any tensor, so
// their values are never part of a graph (the scalar rule).
//
// View ops (reshape, permute, slice, expand, ...) of a graph input are folded into that
// input's strides (which is why inputs carry strides: a fused kernel reads views in place). A
// view of a node's value is a node with op "view" and attrs shape/strides/offset (elements,
// relative to the value's dense layout); it launches nothing, so the value it views is
// materialised (graph/fusion.h).
#pragma once
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"

namespace kiln {

struct GraphInput {
  Shape shape;
  DType dtype = DType::f32;
  Strides strides;  // in elements; 0 for broadcast dims
};

struct GraphNode {
  std::string op;         // an op registry name (graph/op.h)
  Attrs attrs;
  std::vector<int> args;  // value ids, in the op's argument order
  Shape shape;            // output metadata, already inferred by the recorder
  DType dtype = DType::f32;
};

struct Graph {
  // Where its launches run: the recorded ops' device (part of its fingerprint, so one device's
  // executables are never another's).
  Device device = default_device();
  std::vector<GraphInput> inputs;
  std::vector<GraphNode> nodes;
  std::vector<int> outputs;  // live (materialised) value ids, in the order the caller wants them

  int num_inputs() const { return int(inputs.size()); }
  int num_values() const { return int(inputs.size() + nodes.size()); }
  bool is_input(int v) const { return v >= 0 && v < num_inputs(); }
  // Node index of a value id that is a node result (-1 for an input).
  int node_of(int v) const { return v >= num_inputs() ? v - num_inputs() : -1; }
  int value_of_node(int n) const { return n + num_inputs(); }
  const Shape& shape_of(int v) const;
  DType dtype_of(int v) const;
};

// Checks that every arg and output is a valid value id and that no node reads itself; throws
// kiln::Error "[graph] ...". (Cycles through several nodes are caught by canonicalize.)
void validate(const Graph& g);

// Readable dump, one line per input/node, for errors and logs.
std::string describe(const Graph& g);

}  // namespace kiln
