#include "exec/compile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <unordered_map>

#include "core/error.h"
#include "core/terminal.h"
#include "exec/capture.h"
#include "exec/deferred.h"
#include "exec/dispatch.h"
#include "exec/executable_store.h"
#include "exec/graph_executor.h"
#include "exec/ops.h"
#include "graph/passes.h"

namespace kiln {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::mutex g_mu;  // stats and the executable cache
CompileStats& stats_locked() {
  static CompileStats s;
  return s;
}

// Process-wide executables by canonical-graph fingerprint (collisions confirmed structurally).
std::unordered_map<uint64_t, std::vector<std::shared_ptr<const CompiledGraph>>>& executables_locked() {
  static auto* m = new std::unordered_map<uint64_t, std::vector<std::shared_ptr<const CompiledGraph>>>;  // leaked:
  return *m;  // queued work may still hold entries at exit
}

// The executable of a traced graph: from memory, else the persistent store, else compiled.
std::shared_ptr<const CompiledGraph> executable_for(Graph canonical, CompileEvent& ev) {
  const uint64_t key = fingerprint(canonical);
  ev.fingerprint = key;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& c : executables_locked()[key])
      if (same_structure(c->graph, canonical)) {
        ev.source = "shared";
        ++stats_locked().shared_hits;
        return c;
      }
  }
  const std::filesystem::path dir = executable_cache_dir();
  std::shared_ptr<const CompiledGraph> compiled;
  const auto t0 = std::chrono::steady_clock::now();
  if (!dir.empty()) {
    std::string rejected;
    compiled = load_executable(dir, canonical, &rejected);
    if (!rejected.empty()) {
      print_line(stderr, "kiln: warning: ignoring compile cache entry %s; compiling instead", rejected.c_str());
      std::lock_guard<std::mutex> lock(g_mu);
      ++stats_locked().disk_rejects;
    }
  }
  bool wrote = false;
  if (compiled) {
    ev.source = "disk";
  } else {
    compiled = compile_graph(std::move(canonical), FusionLimits{}, /*plan_memory=*/true);
    ev.source = "compiled";
    if (!dir.empty()) {
      const std::string err = store_executable(dir, *compiled);
      if (!err.empty()) print_line(stderr, "kiln: warning: compile cache not written: %s", err.c_str());
      wrote = err.empty();
    }
  }
  ev.seconds = seconds_since(t0);
  std::lock_guard<std::mutex> lock(g_mu);
  // Another thread may have obtained the same graph meanwhile: keep one executable.
  for (const auto& c : executables_locked()[key])
    if (same_structure(c->graph, compiled->graph)) compiled = c;
  CompileStats& s = stats_locked();
  if (ev.source == "disk") {
    ++s.disk_hits;
    s.load_seconds += ev.seconds;
  } else {
    ++s.compiles;
    s.compile_seconds += ev.seconds;
  }
  s.disk_writes += wrote;
  auto& list = executables_locked()[key];
  if (std::find(list.begin(), list.end(), compiled) == list.end()) list.push_back(compiled);
  return compiled;
}

std::string describe_arg(const Tensor& t) {
  return dtype_name(t.dtype()) + to_string(t.shape()) + (t.device() == default_device() ? "" : " on " + t.device().str());
}
std::string describe_param(const Tensor& t) { return describe_arg(t) + " strides " + to_string(t.strides()); }

// The bytes a (materialised) tensor view can touch: [lo, hi) in its buffer.
struct Span {
  const Buffer* buffer;
  int64_t lo, hi;
};
Span span_of(const Tensor& t) {
  // Element counts to bytes (a quantized weight is dense and starts at a block boundary).
  const auto bytes = [&](int64_t elems) { return int64_t(storage_bytes(t.dtype(), elems)); };
  int64_t lo = t.offset(), hi = t.offset();
  for (size_t d = 0; d < t.shape().size(); ++d) {
    if (t.shape()[d] == 0) return {t.buffer().get(), bytes(t.offset()), bytes(t.offset())};
    const int64_t ext = (t.shape()[d] - 1) * t.strides()[d];
    (ext > 0 ? hi : lo) += ext;
  }
  return {t.buffer().get(), bytes(lo), bytes(hi + 1)};
}
bool overlap(const Span& a, const Span& b) { return a.buffer == b.buffer && a.lo < b.hi && b.lo < a.hi; }
bool within(const Span& inner, const Span& outer) {
  return inner.buffer == outer.buffer && outer.lo <= inner.lo && inner.hi <= outer.hi;
}

}  // namespace

void CompileOptions::validate(const std::string& what) const {
  KILN_CHECK(!dynamic, "compile", what,
             ": dynamic=true is not supported, use static shapes (each new input shape compiles once)");
  KILN_CHECK(cache_size_limit > 0, "compile", what, ": cache_size_limit must be positive");
}

CompileStats compile_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  return stats_locked();
}

void reset_compile_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  stats_locked() = CompileStats{};
}

void clear_executable_cache() {
  std::lock_guard<std::mutex> lock(g_mu);
  executables_locked().clear();
}

// How a canonical input of the executable is bound at each call.
struct InputBinding {
  enum class Kind { arg, param, constant } kind = Kind::constant;
  int index = -1;          // arg/param index
  Shape shape;
  Strides strides;
  int64_t offset = 0;      // elements, relative to the arg/param's own offset
  DType dtype = DType::f32;
  Tensor constant;         // made while tracing (host scalars, tables built in forward)
};

struct CompiledFunction::Entry {
  std::vector<std::string> arg_sig, param_sig;
  bool eager = false;  // the trace broke (fullgraph=false): this signature runs eagerly
  std::shared_ptr<const CompiledGraph> exec;
  std::vector<InputBinding> bindings;  // per canonical input
  std::vector<int> output_index;
};

CompiledFunction::CompiledFunction(std::string name, Fn fn, CompileOptions options, std::vector<std::string> arg_names)
    : name_(std::move(name)), fn_(std::move(fn)), options_(options), arg_names_(std::move(arg_names)) {
  options_.validate(name_);
}

size_t CompiledFunction::signatures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::shared_ptr<const CompiledFunction::Entry> CompiledFunction::entry_for(std::vector<Tensor>& args,
                                                                           const std::vector<Tensor>& params,
                                                                           bool* run_eagerly) const {
  *run_eagerly = false;
  // Inputs are dense buffers of their own: pending work runs, views are copied, and an
  // arg sharing a buffer with an earlier arg or a parameter gets a copy, so the executable's
  // argument list depends only on shapes and dtypes.
  // Tensors are told apart by the bytes they span, not by buffer: views of one buffer (a block's
  // two outputs are slices of one) are different arguments.
  auto entry = std::make_shared<Entry>();
  std::vector<Span> param_spans;
  for (size_t j = 0; j < params.size(); ++j) {
    KILN_CHECK(params[j].defined(), "compile", name_, ": parameter ", j, " is an undefined tensor");
    params[j].buffer();
    param_spans.push_back(span_of(params[j]));
    // Overlapping parameters (tied weights) are part of the signature: the trace binds the first.
    std::string tied;
    for (size_t i = 0; i < j && tied.empty(); ++i)
      if (overlap(param_spans[i], param_spans[j])) tied = " overlaps #" + std::to_string(i);
    entry->param_sig.push_back(describe_param(params[j]) + tied);
  }
  std::vector<Span> arg_spans;
  for (Tensor& a : args) {
    KILN_CHECK(a.defined(), "compile", name_, ": an argument is an undefined tensor");
    if (!a.is_contiguous()) a = contiguous(a);
    a.buffer();
    Span sp = span_of(a);
    bool overlaps = false;
    for (const Span& o : arg_spans) overlaps |= overlap(o, sp);
    for (const Span& o : param_spans) overlaps |= overlap(o, sp);
    if (overlaps) {  // the same bytes twice: this arg gets its own copy
      a = dispatch("copy", {a});
      a.buffer();
      sp = span_of(a);
    }
    arg_spans.push_back(sp);
  }
  for (size_t i = 0; i < args.size(); ++i) entry->arg_sig.push_back(describe_arg(args[i]));
  std::string key;
  for (const std::string& s : entry->arg_sig) key += s + ";";
  key += "|";
  for (const std::string& s : entry->param_sig) key += s + ";";

  std::string reason = "first call";
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, e] : entries_)
      if (k == key) {
        *run_eagerly = e->eager;
        return e;
      }
    if (!entries_.empty()) {
      // What changed against the most recent signature (the recompile reason).
      const Entry& last = *entries_.back().second;
      reason.clear();
      for (size_t i = 0; i < entry->arg_sig.size() && reason.empty(); ++i)
        if (i >= last.arg_sig.size() || last.arg_sig[i] != entry->arg_sig[i])
          reason = "arg " + std::to_string(i) + (i < arg_names_.size() ? " (" + arg_names_[i] + ")" : "") + " " +
                   (i < last.arg_sig.size() ? last.arg_sig[i] : "-") + " -> " + entry->arg_sig[i];
      for (size_t j = 0; j < entry->param_sig.size() && reason.empty(); ++j)
        if (j >= last.param_sig.size() || last.param_sig[j] != entry->param_sig[j])
          reason = "parameter " + std::to_string(j) + " " + (j < last.param_sig.size() ? last.param_sig[j] : "-") +
                   " -> " + entry->param_sig[j];
      if (reason.empty()) reason = "argument count changed";
    }
    if (entries_.size() >= options_.cache_size_limit) {
      // Recompile storm.
      if (!storm_warned_) {
        std::fprintf(stderr,
                     "kiln: warning: %s has compiled %zu signatures (cache_size_limit); the latest new one: %s. "
                     "Further new signatures %s\n",
                     name_.c_str(), entries_.size(), reason.c_str(),
                     options_.on_storm == CompileOptions::OnStorm::error ? "are errors" : "run eagerly");
        storm_warned_ = true;
      }
      KILN_CHECK(options_.on_storm != CompileOptions::OnStorm::error, "compile", name_, ": more than ",
                 options_.cache_size_limit, " input signatures (cache_size_limit); new one: ", reason);
      *run_eagerly = true;
      return nullptr;
    }
  }

  // Trace (outside the lock: the callable may take its time and other threads may call us).
  CompileEvent ev;
  ev.callable = name_;
  ev.reason = reason;
  // Anything still pending on this thread (module state computed in deferred mode) is computed
  // first, so it counts as existing before the trace (see the parameter check below).
  mark_step();
  const uint64_t serial_before = Buffer::serials_issued();
  std::vector<std::pair<Tensor, std::string>> runtime_inputs;
  for (size_t i = 0; i < args.size(); ++i)
    runtime_inputs.emplace_back(args[i], "argument " + std::to_string(i) +
                                             (i < arg_names_.size() ? " (" + arg_names_[i] + ")" : ""));
  for (size_t j = 0; j < params.size(); ++j) runtime_inputs.emplace_back(params[j], "parameter " + std::to_string(j));
  const auto t0 = std::chrono::steady_clock::now();
  detail::Captured cap;
  try {
    cap = detail::capture(name_, [&] { return fn_(args); }, runtime_inputs);
  } catch (const GraphBreak& e) {
    if (options_.fullgraph) throw;
    entry->eager = true;
    ev.source = std::string("graph break, runs eagerly: ") + e.what();
  }
  ev.trace_seconds = seconds_since(t0);
  if (!entry->eager) {
    // Bind each graph input to an arg, a parameter or a constant made while tracing.
    for (const Tensor& t : cap.inputs) {
      InputBinding b;
      b.shape = t.shape();
      b.strides = t.strides();
      b.dtype = t.dtype();
      const Span sp = span_of(t);
      int k = -1;
      for (size_t i = 0; i < arg_spans.size() && k < 0; ++i)
        if (within(sp, arg_spans[i])) {
          b.kind = InputBinding::Kind::arg;
          k = int(i);
        }
      for (size_t j = 0; j < param_spans.size() && k < 0; ++j)
        if (within(sp, param_spans[j])) {
          b.kind = InputBinding::Kind::param;
          k = int(j);
        }
      if (k >= 0) {
        b.index = k;
        b.offset = t.offset() - (b.kind == InputBinding::Kind::arg ? args : params)[size_t(k)].offset();
      } else {
        KILN_CHECK(t.buffer()->serial() > serial_before, "compile", name_, ": the traced callable reads ",
                   t.describe(),
                   ", which is neither an argument nor a parameter and existed before the trace; a compiled "
                   "module must list every tensor it owns in its parameters()");
        b.constant = t;
      }
      entry->bindings.push_back(std::move(b));
    }
    entry->output_index = cap.output_index;
    ev.nodes = int(cap.graph.nodes.size());
    entry->exec = executable_for(std::move(cap.graph), ev);
    ev.launches = entry->exec->launches();
    ev.arena_bytes = entry->exec->memory.arena_bytes;
    ev.planned_bytes = entry->exec->memory.planned_bytes;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    CompileStats& s = stats_locked();
    ++s.traces;
    s.trace_seconds += ev.trace_seconds;
    if (entry->eager) ++s.graph_breaks;
    s.events.push_back(ev);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [k, e] : entries_)
    if (k == key) {  // another thread got there first
      *run_eagerly = e->eager;
      return e;
    }
  entries_.emplace_back(key, entry);
  *run_eagerly = entry->eager;
  return entry;
}

void CompiledFunction::prepare(const std::vector<Tensor>& args, const std::vector<Tensor>& params) const {
  KILN_CHECK(!detail::capturing(), "compile", name_, ": prepare() inside a trace");
  std::vector<Tensor> a = args;
  bool eager = false;
  entry_for(a, params, &eager);
}

namespace {
thread_local CompiledCallsMet* t_calls_met = nullptr;
}  // namespace

CompiledCallsMet::CompiledCallsMet() : outer_(t_calls_met) { t_calls_met = this; }
CompiledCallsMet::~CompiledCallsMet() { t_calls_met = outer_; }

std::vector<Tensor> CompiledFunction::operator()(const std::vector<Tensor>& args,
                                                 const std::vector<Tensor>& params) const {
  if (detail::capturing()) {  // part of an enclosing trace
    if (t_calls_met) {
      CompiledCallsMet::Call call{this, {}, params};
      for (const Tensor& a : args) call.args.push_back(placeholder_tensor(a.shape(), a.dtype()));
      t_calls_met->calls_.push_back(std::move(call));
    }
    return fn_(args);
  }
  std::vector<Tensor> a = args;
  bool eager = false;
  const std::shared_ptr<const Entry> entry = entry_for(a, params, &eager);
  if (eager) {
    std::lock_guard<std::mutex> lock(g_mu);
    ++stats_locked().eager_fallbacks;
  }
  if (eager) return fn_(a);
  const Device device = a.empty() ? default_device() : a[0].device();
  std::vector<Tensor> bound;
  bound.reserve(entry->bindings.size());
  std::vector<bool> weights;  // the bound parameters, whose linears read them pre-packed
  for (const InputBinding& b : entry->bindings) {
    if (options_.prepack_weights) weights.push_back(b.kind == InputBinding::Kind::param);
    if (b.kind == InputBinding::Kind::constant) {
      bound.push_back(b.constant);
      continue;
    }
    const bool is_arg = b.kind == InputBinding::Kind::arg;
    const Tensor& base = is_arg ? a[size_t(b.index)] : params[size_t(b.index)];
    // Residency: weights must be where the executable runs, else a clear error, not a crash.
    KILN_CHECK(base.device() == device, "compile", name_, ": ", is_arg ? "argument " : "parameter ", b.index, " (",
               base.describe(), ") is not on ", device.str(), ", where this executable runs");
    bound.push_back(Tensor::view_of(base.buffer(), b.shape, b.dtype, b.strides, base.offset() + b.offset));
  }
  // Outputs may be views (a block's two streams are slices of one buffer): values are immutable,
  // and no output lives in the arena (memory_plan.h), so no copy is needed.
  std::vector<Tensor> results = run_graph(entry->exec, bound, /*dense_outputs=*/false, weights);
  std::vector<Tensor> outs;
  outs.reserve(entry->output_index.size());
  for (int k : entry->output_index) outs.push_back(results[size_t(k)]);
  std::lock_guard<std::mutex> lock(g_mu);
  ++stats_locked().calls;
  return outs;
}

}  // namespace kiln
