// Partitioning of a canonical graph into launches: maximal groups of
// elementwise nodes become one fused program each (graph/fused_program.h, one kernel on a device),
// every other node is a launch of its own.
//
// Rules:
//  - Fusable nodes: unary ops (clamp with its min/max attrs), binary ops, "where", "cast", and
//    "copy" (a movement op, but elementwise in effect: its fused form is a load).
//  - A group has exactly one result, which is materialised: a node that is a graph output, or
//    that has a consumer outside the group, ends (roots) its group. Another fusable node joins a
//    group only if every consumer it has is in the group and it is not an output, so nothing
//    but the result ever reaches memory and groups can never depend on each other cyclically.
//  - Every member's shape broadcasts to the result's shape (members computed on a smaller shape,
//    such as `1 + scale` on [B,1,C], are simply evaluated per output element: duplicated
//    broadcasts, identical values).
//  - Limits stop growth (the node stays outside and becomes its own group's result):
//    max_inputs bounds kernel arguments; max_depth bounds nesting, counted in levels of nodes
//    that join two or more fusable operands (a straight chain like x*a+b-c... is one level
//    however long, since it is evaluated as a pipeline over one running value; nesting is
//    what grows the number of live intermediates); max_nodes bounds the program size.
//  - Each op whose output dtype is not f32 is followed by a `round` to that dtype, reproducing
//    eager's store-then-load through the intermediate's storage, so results are bit-identical
//    to strict eager. A cast is just that round; a copy is nothing.
//  - Elementwise nodes are fused even alone (a one-op group is still one launch).
//
//  - View nodes (op "view", graph.h) launch nothing: their group just names a strided view of
//    their (materialised) argument.
//
// Then launches are merged where one kernel can write another's output directly
// (graph/fusion_merge.cc):
//  - chains: a producer (linear, matmul, norms, softmax, sdpa, concat, ...) whose value only
//    feeds a row op (rms_norm, layer_norm, softmax over the last dim), directly or through a
//    plain reshape, runs with it as one launch: the row op rewrites the producer's rows in
//    place. Such a chain, or a lone producer, whose value only feeds one fused elementwise
//    group of the same shape and dtype takes that group as its epilogue, run in place over
//    the output tile by tile. The producer's value never gets a buffer of its own.
//  - transposed writes: a dense copy of a permuted view of an sdpa result (the [B,H,L,D] ->
//    [B,L,H,D] transpose after attention), where that view is the result's only reader, is
//    written by the sdpa launch itself through the inverse permutation; the copy launches nothing.
//  - row-local consumers (RoPE after the per-head norm): a fused group that reads a chain's value,
//    or a concat assembled from chains, only through views that reorder elements within the last
//    dim (x and the pair-reversed x), runs as the epilogue of each chain over that chain's rows;
//    the concat and the group launch nothing.
//  - grouped single-row linears: plain linears (no epilogue, own buffer) of one row that read the
//    same row (a DiT's per-block modulation projections of silu(temb)) run as one launch over
//    all their output columns; the first computes all, the others are `batched`.
//  - concat elimination: when a concat's slices are dense blocks of its output (every dim
//    before the axis is 1, as for B=1 sequences) and each input is a launch result read only
//    by the concat, those launches write straight into the concat's buffer and the concat
//    launches nothing. A concat of adjacent dense views of one value is that value.
//
// Assumes a canonical graph (passes.h): nodes in topological order. Graph outputs that are
// graph inputs need no launch and get no group.
#pragma once
#include <string>
#include <vector>

#include "graph/fused_program.h"
#include "graph/graph.h"

namespace kiln {

// What partition may do: the sizes a fused kernel takes, and what the device's kernels allow.
struct FusionLimits {
  int max_inputs = 24;  // ~24 kernel inputs
  int max_depth = 11;   // ~11 levels (nesting levels, see above)
  int max_nodes = 64;   // ops per group, keeps the per-thread register tiles bounded
  // The device's fused kernels compute whole rows of the last dim in one tile
  // (DeviceRuntime::fused_tiles_hold_whole_rows): only then may a fused program read a row-local
  // view of the buffer it rewrites in place (the row-local consumers above). A kernel that gives
  // each thread one element would read an element another thread has already rewritten.
  bool whole_row_tiles = true;
};

struct LaunchGroup {
  // assembled: a concat whose inputs wrote into its buffer; alias: the same bytes as alias_base.
  // batched: a single-row linear computed by another group's grouped launch (see `batch`).
  enum class Kind { fused_elementwise, single_op, view, epilogue, assembled, alias, batched } kind = Kind::single_op;
  // Canonical node indices of the elementwise members, ascending (topological).
  std::vector<int> nodes;
  int result = -1;                // value id the group produces (materialised)
  // Value ids read by the group (graph inputs or other groups' results). fused_elementwise and
  // epilogue: the program's loads, distinct, in order of first use: load i reads group_inputs[i]
  // (an `internal` value is read in place from the output). single_op and view: the node's
  // args as they are (positional, repeats kept).
  std::vector<int> group_inputs;
  FusedProgram program;  // fused_elementwise; epilogue: empty when there is no elementwise part
  // epilogue: non-elementwise nodes run in order on the output buffer: chain[0] writes it, the
  // rest (row ops) rewrite it in place; then the program, if any, runs over it in place.
  std::vector<int> chain;
  // epilogue: values whose bytes are the output buffer (chain results and plain reshapes of them).
  std::vector<int> internal;
  int into = -1;             // the output is a dense slice of this value's buffer (concat elimination)
  int64_t into_offset = 0;   // element offset of that slice
  // Non-empty: the output is instead a strided view of `into`'s buffer with these strides (a
  // single op writing straight into the dense copy of a transposed view of its result).
  std::vector<int64_t> into_strides;
  // epilogue, slice_axis >= 0: the program computes rows [slice_begin, slice_begin + slice_len)
  // along slice_axis of `into` (an elementwise consumer of this chain's value, or of the concat
  // the chain writes a slice of): the chain writes its value there (at into_offset) and the
  // program rewrites it in place, reading its other inputs sliced the same way and the chain's
  // value through the view values listed in `internal` (row-local: see fusion_merge.cc).
  int slice_axis = -1;
  int64_t slice_begin = 0, slice_len = 0;
  // single_op linear: the results of the other single-row linears reading the same row that this
  // launch computes too (one grouped launch, DeviceRuntime::grouped_linear_rows); their groups are `batched`.
  std::vector<int> batch;
  int alias_base = -1;       // alias: the value whose buffer this group's result reinterprets

  bool launches() const {
    return kind != Kind::view && kind != Kind::assembled && kind != Kind::alias && kind != Kind::batched;
  }
  // "fused_elementwise", the op name, or the chain's ops joined by '+' ("+epilogue" when it has a
  // program): the name counters and kernel timings use.
  std::string launch_name(const Graph& g) const;
};

// Whether `op` can be a member of a fused elementwise group.
bool is_fusable_op(const std::string& op);

// Whether a non-elementwise op may produce into a fused group's output (epilogue fusion).
bool can_take_epilogue(const std::string& op);

// A view of a dense value as `shape` (its consumer's shape, same element count) that keeps every
// element within its row of the last dim: the plain reshape, or the reshape with the last dim
// reversed (RoPE's pair swap). A fused kernel, whose tiles hold whole rows, may read such a view
// of the very buffer it rewrites in place.
bool is_row_local_view(const GraphNode& v, const Shape& shape);

// Groups in an executable order (every group after the groups whose results it reads). Row-local
// consumers are merged only under limits.whole_row_tiles.
std::vector<LaunchGroup> partition(const Graph& g, const FusionLimits& limits = {});

}  // namespace kiln
