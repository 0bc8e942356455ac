#include "exec/deferred.h"

#include "exec/capture.h"
#include "exec/capture_observer.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "devices/runtime.h"
#include "core/env.h"
#include "exec/graph_executor.h"
#include "exec/host.h"
#include "graph/op.h"
#include "graph/passes.h"

namespace kiln {

namespace {

size_t env_size(const char* name, size_t fallback) { return size_t(env::positive_int(name).value_or(fallback)); }

std::mutex g_mu;  // limits, stats and the cache

DeferLimits& limits_locked() {
  static DeferLimits l = [] {
    DeferLimits d;
    d.max_nodes = env_size("KILN_DEFER_MAX_NODES", d.max_nodes);
    d.max_live_bytes = env_size("KILN_DEFER_MAX_LIVE_BYTES", d.max_live_bytes);
    d.cache_capacity = env_size("KILN_GRAPH_CACHE_SIZE", d.cache_capacity);
    return d;
  }();
  return l;
}

struct Stats {
  uint64_t flushes[kNumFlushCauses] = {};
  uint64_t nodes = 0, graphs = 0, hits = 0, misses = 0;
  double compile_seconds = 0, host_seconds = 0;
};
Stats& stats_locked() {
  static Stats s;
  return s;
}

// fingerprint -> compiled graph, least recently used evicted past the capacity.
class GraphCache {
 public:
  struct Entry {
    uint64_t key;
    std::shared_ptr<const CompiledGraph> compiled;
    uint64_t runs = 0;
  };
  Entry* find(uint64_t key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);
    return &*lru_.begin();
  }
  Entry* insert(uint64_t key, std::shared_ptr<const CompiledGraph> c, size_t capacity) {
    if (auto it = index_.find(key); it != index_.end()) lru_.erase(it->second);  // replaced
    lru_.push_front(Entry{key, std::move(c)});
    index_[key] = lru_.begin();
    while (lru_.size() > capacity) {
      index_.erase(lru_.back().key);
      lru_.pop_back();
    }
    return &*lru_.begin();
  }
  void clear() {
    lru_.clear();
    index_.clear();
  }
  const std::list<Entry>& entries() const { return lru_; }

 private:
  std::list<Entry> lru_;
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
};
GraphCache& cache_locked() {
  static auto* c = new GraphCache;  // leaked: queued work may still hold entries at exit
  return *c;
}

// KILN_DEFER_LOG: 1 = one line per flush, 2 = also each launch of every newly compiled graph.
int log_level() {
  static const int level = [] {
    return std::atoi(env::choice("KILN_DEFER_LOG").value_or("0").c_str());
  }();
  return level;
}
bool log_enabled() { return log_level() > 0; }

// Canonical graph -> compiled graph, through the cache.
std::shared_ptr<const CompiledGraph> lookup_or_compile(Graph canonical, FlushCause cause) {
  const uint64_t key = fingerprint(canonical);
  auto log = [&](const CompiledGraph& c, bool hit) {
    if (!log_enabled()) return;
    std::fprintf(stderr, "kiln: defer flush (%s): %zu nodes, %d launches, graph %016llx %s", flush_cause_name(cause),
                 c.graph.nodes.size(), c.launches(), static_cast<unsigned long long>(key),
                 hit ? "cached\n" : "compiled in ");
    if (!hit) std::fprintf(stderr, "%.2f ms\n", c.compile_seconds * 1e3);
    if (!hit && log_level() >= 2) std::fputs(describe_launches(c).c_str(), stderr);
  };
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (GraphCache::Entry* e = cache_locked().find(key)) {
      // A 64-bit structural hash: a hit is confirmed structurally (linear in the graph, far
      // below a compile), so a collision recompiles instead of running the wrong graph.
      if (same_structure(e->compiled->graph, canonical)) {
        ++e->runs;
        ++stats_locked().hits;
        log(*e->compiled, true);
        return e->compiled;
      }
    }
  }
  std::shared_ptr<const CompiledGraph> compiled = compile_graph(std::move(canonical));  // outside the lock
  std::lock_guard<std::mutex> lock(g_mu);
  Stats& s = stats_locked();
  ++s.misses;
  s.compile_seconds += compiled->compile_seconds;
  cache_locked().insert(key, compiled, limits_locked().cache_capacity)->runs = 1;
  log(*compiled, false);
  return compiled;
}

void count_flush(FlushCause cause) {
  std::lock_guard<std::mutex> lock(g_mu);
  ++stats_locked().flushes[int(cause)];
}

// ---- the per-thread pending graph ----

// How a recorded node reads one argument: a materialised tensor (an input of the pending
// graph) or another pending node's value, possibly through a view of it.
struct Ref {
  bool is_node = false;
  int id = -1;            // input index or node index
  bool has_view = false;  // node refs only: shape/strides/offset relative to the node's dense value
  Shape shape;
  Strides strides;
  int64_t offset = 0;
};

struct Node {
  std::string op;
  Attrs attrs;
  std::vector<Ref> args;
  Shape shape;
  DType dtype = DType::f32;
  std::weak_ptr<PendingValue> value;  // live while user code holds a tensor of it
  size_t bytes = 0;
  std::string scope;  // captures only: the module path it was recorded in (ModuleScope)
};

thread_local std::vector<std::string> t_scopes;  // ModuleScope stack of this thread

class Recorder {
 public:
  Recorder() = default;
  // A capture recorder (exec/capture.h): never flushes; a host read of its values is a graph break.
  explicit Recorder(std::string capture_of, std::vector<std::pair<Tensor, std::string>> runtime_inputs = {})
      : capture_(true), what_(std::move(capture_of)), runtime_inputs_(std::move(runtime_inputs)) {}

  // Captures: a host read of a runtime input (an arg or parameter) or a sync is a graph break.
  void check_host_read(const Tensor* t) const {
    auto fail_break = [&](const std::string& what) {
      throw GraphBreak(format_error("compile", what_, ": graph break in ",
                                    ModuleScope::current().empty() ? what_ : ModuleScope::current(), ": ", what,
                                    " inside the traced region; its value is not known when the graph is traced "
                                    "(move the read out of forward, or compile with fullgraph=false)"));
    };
    if (t == nullptr) fail_break("synchronize()");
    if (t->is_pending()) return;  // a captured value: materialize() raises with its op
    for (const auto& [in, name] : runtime_inputs_)
      if (in.buffer() == t->buffer()) fail_break("the host reads " + name + " (" + t->describe() + ")");
  }
  ~Recorder() {
    // Thread exit: drop pending work; any tensor still holding a value of it reports the loss.
    size_t held = 0;
    for (Node& n : nodes_)
      if (auto v = n.value.lock()) {
        v->node = -1;
        ++held;
      }
    if (held > 0)
      std::fprintf(stderr, "kiln: warning: a thread exited with %zu deferred values still held and never computed "
                   "(call kiln::sync() before the thread ends to keep them)\n", held);
  }

  bool empty() const { return nodes_.empty(); }
  size_t size() const { return nodes_.size(); }

  Tensor record(const OpDef& def, const std::vector<Tensor>& inputs, Attrs attrs, const OutputMeta& meta,
                const Device& device) {
    if (!nodes_.empty() && device != device_) {
      KILN_CHECK(!capture_, "compile", what_, ": the traced region runs ops on both ", device_.str(), " and ",
                 device.str(), "; one executable runs on one device");
      flush_all(FlushCause::sync);
    }
    device_ = device;
    Node n;
    n.op = def.name;
    if (capture_) n.scope = ModuleScope::current();
    n.attrs = std::move(attrs);
    for (const Tensor& t : inputs) n.args.push_back(ref(t));
    n.shape = meta.shape;
    n.dtype = meta.dtype;
    n.bytes = size_t(numel(meta.shape)) * dtype_size(meta.dtype);
    auto value = std::make_shared<PendingValue>();
    value->recorder = this;
    value->node = int(nodes_.size());
    n.value = value;
    nodes_.push_back(std::move(n));
    {
      std::lock_guard<std::mutex> lock(g_mu);
      ++stats_locked().nodes;
    }
    Tensor out = Tensor::deferred(std::move(value), meta.shape, meta.dtype, device);
    if (!capture_) check_limits();  // `out` is held, so it is a live output of a limit flush
    return out;
  }

  // Materialises `v` (one of this thread's pending values): flushes the nodes it depends on.
  void materialize(PendingValue& v) {
    KILN_CHECK(owns(v), "defer",
               "a deferred tensor's pending graph was dropped (its thread exited or an earlier flush failed)");
    if (capture_) {
      const Node& n = nodes_[size_t(v.node)];
      throw GraphBreak(format_error(
          "compile", what_, ": graph break in ", n.scope.empty() ? what_ : n.scope, ": the host reads the value of op '",
          n.op, "' (", dtype_name(n.dtype), to_string(n.shape),
          ") inside the traced region; with fullgraph=true the region must be one graph (move the read out of "
          "forward, or compile with fullgraph=false to run this signature eagerly)"));
    }
    flush(ancestors_of(v.node), FlushCause::host_read);
  }

  // Capture: the graph computing `outputs`, canonical, with the tensors its inputs were.
  // Afterwards the recorder holds nothing (the traced values are never computed).
  detail::Captured finish_capture(const std::vector<Tensor>& outputs) {
    std::vector<Ref> out_refs;
    for (const Tensor& t : outputs) {
      KILN_CHECK(t.defined(), "compile", what_, ": the traced callable returned an undefined tensor");
      out_refs.push_back(ref(t));
    }
    Graph g;
    g.device = device_;
    std::vector<int> value_of;
    add_nodes(g, std::vector<char>(nodes_.size(), 1), value_of, [](size_t) { return false; }, nullptr);
    for (const Ref& r : out_refs) g.outputs.push_back(value_id(g, value_of, r));
    detail::Captured c;
    c.nodes_recorded = nodes_.size();
    c.recorded = g;
    CanonicalMap map;
    c.graph = canonicalize(g, &map);
    for (int i : map.input_order) c.inputs.push_back(inputs_[size_t(i)]);
    c.output_index = map.output_index;
    abandon();
    return c;
  }

  // Drops every node without running it; held values report the loss when read.
  void abandon() {
    for (Node& n : nodes_)
      if (auto v = n.value.lock()) v->node = -1;
    nodes_.clear();
    inputs_.clear();
    input_index_.clear();
  }

  void flush_all(FlushCause cause) {
    if (nodes_.empty()) return;
    std::vector<char> all(nodes_.size(), 1);
    flush(all, cause);
  }

 private:
  // Whether `v` is the value of one of this graph's pending nodes (not a stale index).
  bool owns(const PendingValue& v) const {
    return v.node >= 0 && v.node < int(nodes_.size()) && nodes_[size_t(v.node)].value.lock().get() == &v;
  }

  Ref ref(const Tensor& t) {
    Ref r;
    // A capture reads a value pending in the thread's deferred graph as a computed input.
    if (capture_ && t.is_pending() && t.pending_value()->recorder != this) t.buffer();
    if (t.is_pending()) {
      const PendingValue& v = *t.pending_value();
      KILN_CHECK(v.recorder == this, "defer", "a deferred tensor (", t.describe(),
                 ") recorded on another thread is used here; flush it there first (kiln::sync or mark_step)");
      KILN_CHECK(owns(v), "defer",
                 "a deferred tensor's pending graph was dropped (its thread exited or an earlier flush failed)");
      const Node& base = nodes_[size_t(v.node)];
      r.is_node = true;
      r.id = v.node;
      r.has_view = !(t.shape() == base.shape && t.dtype() == base.dtype && t.offset() == 0 && t.is_contiguous());
      if (r.has_view) {
        r.shape = t.shape();
        r.strides = canonical_unit_strides(t.shape(), t.strides());
        r.offset = t.offset();
      }
      return r;
    }
    r.id = intern(t);
    return r;
  }

  // Index of a materialised tensor among the pending graph's inputs (one per distinct view).
  int intern(const Tensor& given) {
    const Strides unit = canonical_unit_strides(given.shape(), given.strides());
    const Tensor t = unit == given.strides() ? given
                                             : Tensor::view_of(given.buffer(), given.shape(), given.dtype(), unit,
                                                               given.offset());
    auto& candidates = input_index_[t.buffer().get()];
    for (int i : candidates) {
      const Tensor& u = inputs_[size_t(i)];
      if (u.offset() == t.offset() && u.shape() == t.shape() && u.strides() == t.strides() && u.dtype() == t.dtype())
        return i;
    }
    inputs_.push_back(t);
    candidates.push_back(int(inputs_.size()) - 1);
    return int(inputs_.size()) - 1;
  }

  // Appends all inputs and the selected nodes to `g` (value_of: recorder node -> value id); a
  // node for which is_output(i) holds becomes a graph output (listed in out_nodes).
  template <typename IsOutput>
  void add_nodes(Graph& g, const std::vector<char>& selected, std::vector<int>& value_of, IsOutput is_output,
                 std::vector<int>* out_nodes) const {
    for (const Tensor& t : inputs_) g.inputs.push_back(GraphInput{t.shape(), t.dtype(), t.strides()});
    const size_t nn = nodes_.size();
    value_of.assign(nn, -1);
    for (size_t i = 0; i < nn; ++i) {
      if (!selected[i]) continue;
      const Node& n = nodes_[i];
      GraphNode gn;
      gn.op = n.op;
      gn.attrs = n.attrs;
      for (const Ref& a : n.args) gn.args.push_back(value_id(g, value_of, a));
      gn.shape = n.shape;
      gn.dtype = n.dtype;
      g.nodes.push_back(std::move(gn));
      value_of[i] = g.num_values() - 1;
      if (is_output(i)) {
        g.outputs.push_back(value_of[i]);
        if (out_nodes) out_nodes->push_back(int(i));
      }
    }
  }

  // The value id an argument reads: an input, a node's value, or a view node over it.
  int value_id(Graph& g, const std::vector<int>& value_of, const Ref& a) const {
    if (!a.is_node) return a.id;
    const int base = value_of[size_t(a.id)];
    if (!a.has_view) return base;
    GraphNode v;
    v.op = "view";
    v.attrs = Attrs{{"shape", a.shape}, {"strides", a.strides}, {"offset", a.offset}};
    v.args = {base};
    v.shape = a.shape;
    v.dtype = nodes_[size_t(a.id)].dtype;
    g.nodes.push_back(std::move(v));
    return g.num_values() - 1;
  }

  std::vector<char> ancestors_of(int node) const {
    std::vector<char> need(nodes_.size(), 0);
    need[size_t(node)] = 1;
    for (int n = node; n >= 0; --n) {  // args always point to earlier nodes
      if (!need[size_t(n)]) continue;
      for (const Ref& a : nodes_[size_t(n)].args)
        if (a.is_node) need[size_t(a.id)] = 1;
    }
    return need;
  }

  void check_limits() {
    const DeferLimits lim = defer_limits();
    if (nodes_.size() >= lim.max_nodes) return flush_all(FlushCause::size_limit);
    if (nodes_.size() % 64 != 0) return;  // live bytes are summed now and then, not per op
    size_t live = 0;
    for (const Node& n : nodes_)
      if (!n.value.expired()) live += n.bytes;
    if (live > lim.max_live_bytes) flush_all(FlushCause::memory_limit);
  }

  // Runs the selected nodes (closed under dependencies) as one graph and keeps the rest pending.
  void flush(const std::vector<char>& selected, FlushCause cause) {
    count_flush(cause);
    try {
      run(selected, cause);
    } catch (...) {
      // The graph could not run: every pending value is lost. Tensors still holding one report it.
      for (Node& n : nodes_)
        if (auto v = n.value.lock()) v->node = -1;
      nodes_.clear();
      inputs_.clear();
      input_index_.clear();
      throw;
    }
  }

  void run(const std::vector<char>& selected, FlushCause cause) {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t nn = nodes_.size();
    std::vector<char> consumed_outside(nn, 0);
    for (size_t i = 0; i < nn; ++i)
      if (!selected[i])
        for (const Ref& a : nodes_[i].args)
          if (a.is_node && selected[size_t(a.id)]) consumed_outside[size_t(a.id)] = 1;

    // 1. The graph: all inputs (canonicalize drops unread ones), selected nodes, view nodes.
    Graph g;
    g.device = device_;
    std::vector<int> value_of;
    std::vector<int> out_nodes;  // recorder node per graph output
    add_nodes(g, selected, value_of,
              [&](size_t i) { return !nodes_[i].value.expired() || consumed_outside[i]; }, &out_nodes);

    // 2. Canonical form, cache, launch.
    std::vector<Tensor> results;
    CanonicalMap map;
    if (!g.outputs.empty()) {
      Graph canonical = canonicalize(g, &map);
      std::shared_ptr<const CompiledGraph> compiled = lookup_or_compile(std::move(canonical), cause);
      {
        std::lock_guard<std::mutex> lock(g_mu);
        stats_locked().host_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      std::vector<Tensor> bound;
      for (int i : map.input_order) bound.push_back(inputs_[size_t(i)]);
      results = run_graph(compiled, bound);
      std::lock_guard<std::mutex> lock(g_mu);
      ++stats_locked().graphs;
    }

    // 3. Hand results to the values user code holds; remember them for the nodes still pending.
    std::vector<Tensor> done(nn);
    for (size_t k = 0; k < out_nodes.size(); ++k) {
      const Tensor& t = results[size_t(map.output_index[k])];
      const size_t i = size_t(out_nodes[k]);
      done[i] = t;
      if (auto v = nodes_[i].value.lock()) {
        v->buffer = t.buffer();
        v->node = -1;
      }
    }

    // 4. Keep the unselected nodes; their reads of flushed values become graph inputs. Built
    //    aside and swapped in, so a failure here leaves the recorder as it was (flush() then
    //    drops it whole).
    Recorder kept;
    std::vector<int> new_index(nn, -1);
    for (size_t i = 0; i < nn; ++i) {
      if (selected[i]) continue;
      Node n = nodes_[i];
      for (Ref& a : n.args) {
        if (!a.is_node) {
          a.id = kept.intern(inputs_[size_t(a.id)]);
        } else if (selected[size_t(a.id)]) {
          const Tensor& t = done[size_t(a.id)];
          const Tensor in = a.has_view ? Tensor::view_of(t.buffer(), a.shape, t.dtype(), a.strides, a.offset) : t;
          a = Ref{};
          a.id = kept.intern(in);
        } else {
          a.id = new_index[size_t(a.id)];
        }
      }
      new_index[i] = int(kept.nodes_.size());
      kept.nodes_.push_back(std::move(n));
    }
    // Commit (no-throw from here).
    for (size_t i = 0; i < nn; ++i)
      if (auto v = nodes_[i].value.lock(); v && !selected[i]) v->node = new_index[i];
    inputs_.swap(kept.inputs_);
    input_index_.swap(kept.input_index_);
    nodes_.swap(kept.nodes_);
    kept.nodes_.clear();  // the old nodes: their values were re-pointed or materialised
  }

  bool capture_ = false;
  std::string what_;  // captures: the traced callable's name
  std::vector<std::pair<Tensor, std::string>> runtime_inputs_;  // captures: args and parameters
  Device device_ = default_device();
  std::vector<Tensor> inputs_;
  std::unordered_map<const void*, std::vector<int>> input_index_;
  std::vector<Node> nodes_;
};

Recorder& default_recorder() {
  thread_local Recorder r;
  return r;
}
thread_local Recorder* t_capture = nullptr;  // the active capture, if any
// Where this thread's ops record: the active capture, else its deferred pending graph.
Recorder& recorder() { return t_capture ? *t_capture : default_recorder(); }

void materialize_hook(PendingValue& v) {
  KILN_CHECK(v.node >= 0, "defer",
             "a deferred tensor's pending graph was dropped (its thread exited or an earlier flush failed)");
  if (t_capture != nullptr && v.recorder == t_capture) return t_capture->materialize(v);  // a graph break
  Recorder& r = default_recorder();
  KILN_CHECK(v.recorder == &r, "defer",
             "a deferred tensor recorded on another thread is read here; flush it there first (kiln::sync or "
             "mark_step)");
  r.materialize(v);
}

}  // namespace

const char* flush_cause_name(FlushCause cause) {
  switch (cause) {
    case FlushCause::host_read: return "host_read";
    case FlushCause::sync: return "sync";
    case FlushCause::step: return "step";
    case FlushCause::mode_switch: return "mode_switch";
    case FlushCause::size_limit: return "size_limit";
    case FlushCause::memory_limit: return "memory_limit";
  }
  return "?";
}

DeferLimits defer_limits() {
  std::lock_guard<std::mutex> lock(g_mu);
  return limits_locked();
}

void set_defer_limits(const DeferLimits& limits) {
  KILN_CHECK(limits.max_nodes > 0 && limits.cache_capacity > 0, "defer", "limits must be positive");
  std::lock_guard<std::mutex> lock(g_mu);
  limits_locked() = limits;
}

uint64_t DeferredStats::flushes_total() const {
  uint64_t n = 0;
  for (uint64_t f : flushes) n += f;
  return n;
}

DeferredStats deferred_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  const Stats& s = stats_locked();
  DeferredStats out;
  for (int i = 0; i < kNumFlushCauses; ++i) out.flushes[i] = s.flushes[i];
  out.nodes_recorded = s.nodes;
  out.graphs_run = s.graphs;
  out.cache_hits = s.hits;
  out.cache_misses = s.misses;
  out.compile_seconds = s.compile_seconds;
  out.host_seconds = s.host_seconds;
  for (const GraphCache::Entry& e : cache_locked().entries())
    out.entries.push_back(GraphCacheEntryStats{e.key, e.compiled->compile_seconds, e.runs,
                                               int(e.compiled->graph.nodes.size()), e.compiled->launches(),
                                               e.compiled->buffers()});
  return out;
}

void reset_deferred_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  stats_locked() = Stats{};
}

void clear_graph_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  cache_locked().clear();
}

void mark_step() { default_recorder().flush_all(FlushCause::step); }

void sync() { synchronize(default_device()); }

size_t pending_nodes() { return default_recorder().size(); }

ModuleScope::ModuleScope(const std::string& name) { t_scopes.push_back(name); }
ModuleScope::~ModuleScope() { t_scopes.pop_back(); }
std::string ModuleScope::current() {
  std::string path;
  for (const std::string& s : t_scopes) path += (path.empty() ? "" : ".") + s;
  return path;
}

namespace detail {

Tensor record(const OpDef& def, std::vector<Tensor> inputs, Attrs attrs, const OutputMeta& meta,
              const Device& device) {
  set_materialize_hook(&materialize_hook);
  return recorder().record(def, inputs, std::move(attrs), meta, device);
}

void flush_pending(FlushCause cause) { default_recorder().flush_all(cause); }

void flush_before_eager_op() {
  Recorder& r = default_recorder();
  if (!r.empty()) r.flush_all(FlushCause::mode_switch);
}

bool capturing() { return t_capture != nullptr; }

void check_host_read(const Tensor* t) {
  if (t_capture != nullptr) t_capture->check_host_read(t);
}

Captured capture(const std::string& what, const std::function<std::vector<Tensor>()>& fn,
                 const std::vector<std::pair<Tensor, std::string>>& runtime_inputs) {
  KILN_CHECK(t_capture == nullptr, "compile", what, ": traced inside another trace; call it directly instead");
  set_materialize_hook(&materialize_hook);
  Recorder cap(what, runtime_inputs);
  struct Active {
    explicit Active(Recorder* r) { t_capture = r; }
    ~Active() { t_capture = nullptr; }
  };
  std::vector<Tensor> outputs;
  {
    Active active(&cap);
    try {
      outputs = fn();
    } catch (...) {
      cap.abandon();
      throw;
    }
  }
  Captured done;
  try {
    done = cap.finish_capture(outputs);
  } catch (...) {
    cap.abandon();
    throw;
  }
  CaptureObserver::notify(what, done);
  return done;
}

}  // namespace detail

namespace {
thread_local CaptureObserver* t_observer = nullptr;
}  // namespace

CaptureObserver::CaptureObserver(Callback callback) : callback_(std::move(callback)), previous_(t_observer) {
  t_observer = this;
}
CaptureObserver::~CaptureObserver() { t_observer = previous_; }

void CaptureObserver::notify(const std::string& what, const detail::Captured& captured) {
  for (CaptureObserver* o = t_observer; o; o = o->previous_) o->callback_(what, captured);
}

}  // namespace kiln
