#include "exec/memory_plan.h"

#include "devices/runtime.h"

#include <algorithm>
#include <numeric>

namespace kiln {

namespace {
constexpr size_t kAlign = 64;
size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

MemoryPlan plan_memory(const Graph& g, const std::vector<LaunchGroup>& groups) {
  const int nv = g.num_values();
  // root[v]: the value whose buffer holds v's bytes (-1 for graph inputs and what views them).
  std::vector<int> root(size_t(nv), -1);
  std::vector<int> start(size_t(nv), -1), end(size_t(nv), -1);
  auto touch = [&](int v, int when) {
    const int r = root[size_t(v)];
    if (r < 0) return;
    if (start[size_t(r)] < 0 || when < start[size_t(r)]) start[size_t(r)] = when;
    end[size_t(r)] = std::max(end[size_t(r)], when);
  };
  // Assembled concats are written (by the launches that produce their slices) before their own
  // group appears, so they are roots from the start.
  for (const LaunchGroup& grp : groups)
    if (grp.kind == LaunchGroup::Kind::assembled) root[size_t(grp.result)] = grp.result;
  for (size_t i = 0; i < groups.size(); ++i) {
    const LaunchGroup& grp = groups[i];
    const int when = int(i);
    switch (grp.kind) {
      case LaunchGroup::Kind::view: root[size_t(grp.result)] = root[size_t(grp.group_inputs.at(0))]; break;
      case LaunchGroup::Kind::alias: root[size_t(grp.result)] = root[size_t(grp.alias_base)]; break;
      case LaunchGroup::Kind::assembled:
      case LaunchGroup::Kind::batched: break;
      default: root[size_t(grp.result)] = grp.into >= 0 ? root[size_t(grp.into)] : grp.result; break;
    }
    std::vector<int> reads = grp.group_inputs;
    for (int n : grp.chain)
      for (int a : g.nodes[size_t(n)].args) reads.push_back(a);
    if (grp.into >= 0) reads.push_back(grp.into);
    if (grp.alias_base >= 0) reads.push_back(grp.alias_base);
    // Values living inside this launch's output (an epilogue chain's steps) are not separate
    // reads; the output itself is written here, whether or not it is one of them.
    for (int v : reads)
      if (std::find(grp.internal.begin(), grp.internal.end(), v) == grp.internal.end()) touch(v, when);
    touch(grp.result, when);
    // A grouped launch writes its batched linears' buffers here. (It also reads their weights
    // here, which the fuser only allows when they are produced before it, so their lifetimes
    // already cover this launch.)
    for (int v : grp.batch) {
      root[size_t(v)] = v;
      touch(v, when);
    }
  }

  MemoryPlan plan;
  plan.offset.assign(size_t(nv), -1);
  std::vector<char> excluded(size_t(nv), 0);
  for (int o : g.outputs)
    if (root[size_t(o)] >= 0) excluded[size_t(root[size_t(o)])] = 1;
  std::vector<int> planned;
  for (int v = 0; v < nv; ++v)
    if (root[size_t(v)] == v && !excluded[size_t(v)] && start[size_t(v)] >= 0) planned.push_back(v);
  auto bytes_of = [&](int v) { return aligned(storage_bytes(g.dtype_of(v), numel(g.shape_of(v)))); };
  // Largest first, each at the lowest offset free over its whole lifetime (first fit).
  std::stable_sort(planned.begin(), planned.end(), [&](int a, int b) { return bytes_of(a) > bytes_of(b); });
  std::vector<int> placed;
  for (int v : planned) {
    const size_t size = bytes_of(v);
    plan.planned_bytes += size;
    std::vector<std::pair<size_t, size_t>> busy;  // [begin, end) of overlapping lifetimes
    for (int u : placed)
      if (start[size_t(u)] <= end[size_t(v)] && start[size_t(v)] <= end[size_t(u)])
        busy.emplace_back(size_t(plan.offset[size_t(u)]), size_t(plan.offset[size_t(u)]) + bytes_of(u));
    std::sort(busy.begin(), busy.end());
    size_t at = 0;
    for (const auto& [b, e] : busy) {
      if (at + size <= b) break;
      at = std::max(at, e);
    }
    plan.offset[size_t(v)] = int64_t(at);
    plan.arena_bytes = std::max(plan.arena_bytes, at + size);
    placed.push_back(v);
  }
  return plan;
}

size_t unfused_peak_bytes(const Graph& g, size_t in_flight, const std::function<size_t(size_t)>& allocation_size,
                          size_t in_flight_bytes) {
  const int n = int(g.nodes.size());
  // owner[v]: the node whose allocation holds value v (a view's base, recursively).
  std::vector<int> owner(size_t(g.num_values()), -1), last(size_t(n), -1);
  for (int i = 0; i < n; ++i) {
    const GraphNode& node = g.nodes[size_t(i)];
    const int v = g.value_of_node(i);
    owner[size_t(v)] = node.op == "view" ? owner[size_t(node.args.at(0))] : i;
    for (int a : node.args)
      if (owner[size_t(a)] >= 0) last[size_t(owner[size_t(a)])] = i;
  }
  for (int o : g.outputs)
    if (owner[size_t(o)] >= 0) last[size_t(owner[size_t(o)])] = n;
  // outputs[k]: output bytes of nodes [0, k) (views allocate nothing), as the queue counts them.
  std::vector<size_t> outputs(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    const GraphNode& node = g.nodes[size_t(i)];
    outputs[size_t(i) + 1] = outputs[size_t(i)] + (node.op == "view" ? 0 : size_t(numel(node.shape)) * dtype_size(node.dtype));
  }
  // The host step by which node r has run: in_flight ops later, or the first op whose output
  // would take the not-yet-run outputs from r on past in_flight_bytes, if sooner.
  const auto ran_by = [&](int r) {
    const auto over = std::upper_bound(outputs.begin() + r + 1, outputs.end(),
                                       outputs[size_t(r)] + std::min(in_flight_bytes, ~size_t{0} - outputs[size_t(r)]));
    const int64_t by_bytes = int64_t(over - outputs.begin()) - 1;  // its last node
    return std::min<int64_t>({n, int64_t(r) + int64_t(in_flight), std::max<int64_t>(by_bytes, r + 1)});
  };
  std::vector<size_t> freed_at(size_t(n) + 1, 0);
  size_t live = 0, peak = 0;
  for (int i = 0; i < n; ++i) {
    const GraphNode& node = g.nodes[size_t(i)];
    if (node.op != "view") {
      size_t bytes = size_t(numel(node.shape)) * dtype_size(node.dtype);
      if (allocation_size) bytes = allocation_size(bytes);
      live += bytes;
      freed_at[size_t(ran_by(std::max(last[size_t(i)], i)))] += bytes;
    }
    peak = std::max(peak, live);
    live -= freed_at[size_t(i)];
  }
  return peak;
}

size_t unfused_peak_bytes_on(const Graph& g, const Device& device) {
  DeviceRuntime& rt = runtime(device);
  // In flight: the queued items, the one running and the one being enqueued.
  return unfused_peak_bytes(g, rt.max_in_flight() + 2, [&rt](size_t b) { return rt.allocation_size(b); },
                            rt.max_in_flight_bytes());
}

}  // namespace kiln
