// Canonicalisation and fingerprinting of a pending graph: the graph cache
// key must depend only on the computation's structure, never on the order the recorder happened
// to store things in, on memory addresses, or on the values of inputs (host scalars included).
#pragma once
#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace kiln {

// How a canonical graph relates to the graph it was made from.
struct CanonicalMap {
  // Canonical input i is original input input_order[i]. Inputs nothing live reads are dropped.
  std::vector<int> input_order;
  // For each original output (same index as Graph::outputs), the index into the canonical
  // graph's outputs holding its value. Two outputs CSE proves equal share one canonical output.
  std::vector<int> output_index;
  // Original value id -> canonical value id, or -1 where the value was dropped as dead.
  std::vector<int> value_map;
};

// Returns the canonical form of `g`:
//  - DCE: only nodes reachable from the outputs are kept;
//  - no-op removal: a cast to its argument's dtype is replaced by its argument (so an output may
//    end up being an input value id; the caller then returns that input as is);
//  - CSE: nodes with the same op, attrs and (already merged) args are one node;
//  - numbering: nodes in post-order of a depth-first walk from the outputs (in output order,
//    args in argument order), inputs in order of first use by those nodes, duplicate outputs
//    merged. This depends only on structure, so two recordings of one computation that stored
//    inputs/nodes in a different order give identical graphs.
// Not removed (yet): `x*1`-style identities (scalars are inputs, their values are unknown here)
// and copies of dense inputs (a copy may be requested precisely to get a private buffer).
// Throws "[graph] ..." for invalid ids or a cycle.
Graph canonicalize(const Graph& g, CanonicalMap* map);
// Convenience form: only the input mapping (input_order as in CanonicalMap).
Graph canonicalize(const Graph& g, std::vector<int>* input_order = nullptr);

// Bumped whenever the serialisation below changes, so stale persistent-cache keys never match.
constexpr uint64_t kGraphFormatVersion = 2;  // 2: the graph's device

// A stable 64-bit FNV-1a hash of a canonical serialisation of `g`: format version, each input's
// rank/shape/exact strides/dtype, each node's op name, attrs (sorted names; ints as values,
// doubles by bit pattern, lists and strings length-prefixed), args, output shape and dtype, and
// the output list. Integers are fed byte by byte little-endian, so the value is the same on
// every host. Call it on a canonical graph (canonicalize) to get a cache key.
uint64_t fingerprint(const Graph& g);

// Whether two graphs are identical (inputs' shape/dtype/strides, nodes' op/attrs/args/shape/
// dtype, outputs): confirms a fingerprint match before a cached graph is reused.
bool same_structure(const Graph& a, const Graph& b);

}  // namespace kiln
