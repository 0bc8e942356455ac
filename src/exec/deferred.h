// Deferred-and-fused eager mode: under EagerMode::DeferAndFuse
// an op call only records a node in the calling thread's pending graph and returns a deferred
// tensor that carries full metadata (so shape/dtype errors still raise at the call). At a flush
// the pending graph is canonicalised (CSE, DCE, topological numbering), looked up in a graph
// cache by its structural fingerprint, partitioned into fused launches on a miss
// (graph/fusion.h), and enqueued (exec/graph_executor.h). Host scalars are 0-d tensors created
// from host data, i.e. graph inputs, so a denoising step whose sigma/dt/timestep change still
// has the same fingerprint and hits the cache.
//
// Flushes (each counted by cause):
//  - host_read: a host read or buffer access of a deferred value (to_vector, item, wait, ...)
//    flushes only the nodes that value needs (plus whatever else they feed that is still
//    pending stays recorded), so an early read does not split the rest of a step's graph;
//  - sync: kiln::sync() / synchronize() flush everything and wait;
//  - step: mark_step(), which pipelines call after each denoising step; non-blocking;
//  - mode_switch: the first strict-eager op after recording in deferred mode;
//  - size_limit: the pending graph reached max_nodes nodes;
//  - memory_limit: live pending outputs (values user code still holds) exceed max_live_bytes.
// Pending work is dropped without running when a thread exits: graphs are pure, so nothing is
// lost unless a tensor of it is still held somewhere (then a warning is printed, and reading it
// later is an error naming the cause).
//
// Deferred tensors belong to the thread that recorded them: reading one on another thread is an
// error until the recording thread flushes (sync() / mark_step()).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/tensor.h"

namespace kiln {

struct OpDef;
struct OutputMeta;

enum class FlushCause { host_read, sync, step, mode_switch, size_limit, memory_limit };
constexpr int kNumFlushCauses = 6;
const char* flush_cause_name(FlushCause cause);

struct DeferLimits {
  size_t max_nodes = 20000;                   // KILN_DEFER_MAX_NODES
  size_t max_live_bytes = size_t(8) << 30;    // KILN_DEFER_MAX_LIVE_BYTES
  size_t cache_capacity = 2048;               // KILN_GRAPH_CACHE_SIZE (LRU entries)
};
// Process-wide; the defaults come from the environment, read once.
DeferLimits defer_limits();
void set_defer_limits(const DeferLimits& limits);

struct GraphCacheEntryStats {
  uint64_t fingerprint = 0;
  double compile_seconds = 0;
  uint64_t runs = 0;       // times the executable was run (1 + hits)
  int nodes = 0;           // canonical graph size
  int launches = 0;        // kernels per run
  int buffers = 0;         // device buffers per run (CompiledGraph::buffers)
};

struct DeferredStats {
  uint64_t flushes[kNumFlushCauses] = {};  // indexed by FlushCause
  uint64_t nodes_recorded = 0;
  uint64_t graphs_run = 0;
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;  // = graphs compiled
  double compile_seconds = 0; // total over misses
  double host_seconds = 0;    // host time turning pending nodes into a graph, canonicalising,
                              // hashing and looking it up (compiling on a miss), before launch
  std::vector<GraphCacheEntryStats> entries;  // the cache's current entries, most recently used first
  uint64_t flushes_total() const;
};
DeferredStats deferred_stats();
// Zeroes the counters (not the cache); clear_graph_cache() empties the cache.
void reset_deferred_stats();
void clear_graph_cache();

// Step boundary: flushes everything pending on this thread without waiting (cause step).
void mark_step();
// Flushes everything pending on this thread (cause sync) and waits for all device work; the same
// as synchronize(default_device()) (exec/host.h), which flushes too.
void sync();
// Nodes recorded on this thread and not flushed yet.
size_t pending_nodes();

namespace detail {
// Records `def` (inputs/attrs already validated, `meta` inferred by the dispatcher).
Tensor record(const OpDef& def, std::vector<Tensor> inputs, Attrs attrs, const OutputMeta& meta,
              const Device& device);
// Flushes everything pending on this thread (no-op when nothing is).
void flush_pending(FlushCause cause);
// Before a strict-eager op: flushes this thread's pending graph (cause mode_switch) if any.
void flush_before_eager_op();
}  // namespace detail

}  // namespace kiln
