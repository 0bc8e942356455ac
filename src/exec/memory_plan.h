// Static memory plan of a compiled executable: every intermediate a run allocates is placed at
// a fixed offset of one arena, and two values share bytes when their lifetimes (in launch order)
// do not overlap. Launches run in
// order on the device's queue, so a value's bytes are free once the last launch reading it has
// been enqueued before the next writer.
//
// Graph outputs (and anything they view) are not planned: they are handed to the caller, who
// may keep them past the run, so they get buffers of their own.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/device.h"
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

// Peak bytes of the values an op-by-op (strict eager) run of `g` keeps alive at once: every
// node's result from its op until its last reader has run (views extend their base), graph
// outputs to the end. The host enqueues up to `in_flight` ops ahead of the device, as long as the
// outputs of the ops not yet run hold at most `in_flight_bytes` (one op over it when none is
// pending), so a value is counted as freed only when the host could have gone that far past its
// last reader. The activation estimate of
// model offload's fail-fast check (deferred and compiled runs need less: fusion and the arena
// remove values).
// Each value takes allocation_size(bytes) (the allocator's size class).
size_t unfused_peak_bytes(const Graph& g, size_t in_flight,
                          const std::function<size_t(size_t)>& allocation_size = nullptr,
                          size_t in_flight_bytes = ~size_t{0});
// The same for the device `device` runs on: its queue depth and bytes, and size classes.
size_t unfused_peak_bytes_on(const Graph& g, const Device& device);

}  // namespace kiln
