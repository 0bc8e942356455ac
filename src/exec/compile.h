// Compiled mode: a callable is traced once per input signature
// into one static-shape graph (exec/capture.h), compiled with the same passes and kernels as
// deferred mode plus a static memory plan (exec/memory_plan.h), and cached; later calls with the
// same signature only bind buffers and enqueue the launches.
//
// Parameters (weights) are runtime arguments of the executable, never constants: a callable is
// called with its args and its parameter list, and the executable binds both by position. So
// swapping weights of the same shape, or moving them between host and device, never recompiles,
// and module instances of the same structure share one executable: every instance traces its
// own forward once (cheap host work), and the trace's canonical graph is looked up in one
// process-wide executable cache (and the persistent store, exec/executable_store.h) before
// anything is compiled. Only a graph seen for the first time compiles.
//
// Signature (a new one traces again, and compiles if its graph is new): every arg's shape, dtype
// and device; every parameter's shape, dtype and strides; which parameters overlap (tied
// weights). Args overlapping another arg or a parameter are copied first.
// Not part of it: values (sigma, timestep, guidance are 0-d/1-d tensor args), step counts, the
// prompt text, the weights' contents or residency.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

struct CompileOptions {
  // true: the callable must trace as one graph; a host read inside it is an error naming the
  // op and module. false: a signature whose trace breaks runs eagerly (the break is recorded).
  bool fullgraph = false;
  bool dynamic = false;  // only static shapes: true is refused
  // Signatures one callable may compile before the recompile-storm policy applies.
  size_t cache_size_limit = 8;
  enum class OnStorm { fallback_eager, error } on_storm = OnStorm::fallback_eager;
  // Linears read the module's weights (the parameters) pre-packed in the GEMM library's layout,
  // made on first use and kept beside each weight while it stays on the device: one more copy of
  // every multi-row linear's weight, for GEMMs that skip their per-call packing. Same bits either
  // way. Not part of the executable: changing it never recompiles.
  bool prepack_weights = true;
  void validate(const std::string& what) const;  // throws "[compile] ..." for dynamic=true etc.
};

// One executable obtained for a new signature, for --report.
struct CompileEvent {
  std::string callable;  // "transformer", "FluxTransformerBlock"
  std::string reason;    // "first call" or what changed ("arg 0 shape f32[1,64,64] -> f32[1,256,64]")
  std::string source;    // "compiled", "disk" (persistent cache) or "shared" (same graph already in memory)
  double trace_seconds = 0;
  double seconds = 0;    // compile or load time (0 for shared)
  uint64_t fingerprint = 0;
  int nodes = 0, launches = 0;
  size_t arena_bytes = 0;    // the planned arena (exec/memory_plan.h)
  size_t planned_bytes = 0;  // its values laid end to end, without reuse
};

struct CompileStats {
  uint64_t calls = 0;        // compiled runs (executables enqueued)
  uint64_t traces = 0;       // signatures traced
  uint64_t compiles = 0;     // graphs compiled (not found in memory or on disk)
  uint64_t shared_hits = 0;  // traces whose graph was already compiled in this process
  uint64_t disk_hits = 0;    // executables loaded from the persistent cache
  uint64_t disk_writes = 0;
  uint64_t disk_rejects = 0;  // stored entries ignored (corrupt, foreign); each warned about
  uint64_t graph_breaks = 0;  // fullgraph=false signatures that run eagerly
  uint64_t eager_fallbacks = 0;  // calls run eagerly (graph break, or past cache_size_limit)
  double trace_seconds = 0, compile_seconds = 0, load_seconds = 0;
  std::vector<CompileEvent> events;  // in order
};
CompileStats compile_stats();
void reset_compile_stats();
// Empties the process-wide executable cache (not the persistent one, not callables' bindings).
void clear_executable_cache();

// A callable under compiled mode. Thread-safe.
class CompiledFunction {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>& args)>;
  // `name` names the callable in errors and reports; `arg_names` (optional) name its args.
  CompiledFunction(std::string name, Fn fn, CompileOptions options, std::vector<std::string> arg_names = {});

  // Runs the executable for this signature (tracing/compiling it first if it is new). `params`
  // are the tensors `fn` reads that are not args (its module's weights), in a stable order.
  // Inside another callable's trace this just calls `fn` (it becomes part of that graph).
  std::vector<Tensor> operator()(const std::vector<Tensor>& args, const std::vector<Tensor>& params) const;
  // Traces and compiles (or loads) the executable for this signature without running it
  // (warmup); `args` only need the right shapes and dtypes.
  void prepare(const std::vector<Tensor>& args, const std::vector<Tensor>& params) const;

  const std::string& name() const { return name_; }
  const CompileOptions& options() const { return options_; }
  size_t signatures() const;

 private:
  struct Entry;
  std::shared_ptr<const Entry> entry_for(std::vector<Tensor>& args, const std::vector<Tensor>& params,
                                         bool* run_eagerly) const;
  std::string name_;
  Fn fn_;
  CompileOptions options_;
  std::vector<std::string> arg_names_;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<std::string, std::shared_ptr<const Entry>>> entries_;  // signature key -> entry
  mutable bool storm_warned_ = false;
};

// The compiled callables one trace met (a compiled block called inside a model's forward is
// inlined there), each with the args it was called with as placeholders of their shapes and
// dtypes, and its params: what warming those callables up needs, read off one trace of the
// forward instead of hand-listed shapes. Collects on this thread while alive.
class CompiledCallsMet {
 public:
  struct Call {
    const CompiledFunction* function;
    std::vector<Tensor> args, params;
  };
  CompiledCallsMet();
  ~CompiledCallsMet();
  CompiledCallsMet(const CompiledCallsMet&) = delete;
  CompiledCallsMet& operator=(const CompiledCallsMet&) = delete;
  const std::vector<Call>& calls() const { return calls_; }

 private:
  friend class CompiledFunction;
  std::vector<Call> calls_;
  CompiledCallsMet* outer_;
};

}  // namespace kiln
