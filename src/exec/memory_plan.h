// Static memory plan of a compiled executable (runtime.md §2.4, design.md §1 "static memory
// plan"): every intermediate a run allocates is placed at a fixed offset of one arena, and two
// values share bytes when their lifetimes (in launch order) do not overlap. Launches run in
// order on the device's queue, so a value's bytes are free once the last launch reading it has
// been enqueued before the next writer.
//
// Graph outputs (and anything they view) are not planned: they are handed to the caller, who
// may keep them past the run, so they get buffers of their own.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "graph/fusion.h"
#include "graph/graph.h"

namespace kiln {

struct MemoryPlan {
  size_t arena_bytes = 0;
  std::vector<int64_t> offset;  // per value id: byte offset in the arena, or -1 (not in the arena)
  size_t planned_bytes = 0;     // what the planned values would take as separate buffers
  bool empty() const { return offset.empty(); }
};

// Plans the buffers run_graph would allocate for `groups` (graph/fusion.h): launch results that
// do not write into a concat, and assembled concats. Offsets are aligned to 64 bytes.
MemoryPlan plan_memory(const Graph& g, const std::vector<LaunchGroup>& groups);

}  // namespace kiln
