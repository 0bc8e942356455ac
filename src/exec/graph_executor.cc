#include "exec/graph_executor.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>

#include "core/error.h"
#include "core/tensor_view.h"
#include "devices/runtime.h"
#include "exec/counters.h"
#include "exec/profile.h"
#include "graph/op.h"

namespace kiln {

int CompiledGraph::launches() const {
  int n = 0;
  for (const LaunchGroup& grp : groups) n += grp.launches();
  return n;
}

int CompiledGraph::buffers() const {
  int n = 0;
  for (const LaunchGroup& grp : groups)
    n += (grp.launches() && grp.into < 0) || grp.kind == LaunchGroup::Kind::assembled ||
         grp.kind == LaunchGroup::Kind::batched;
  return n;
}

std::shared_ptr<const CompiledGraph> compile_graph(Graph canonical, const FusionLimits& limits, bool plan_memory) {
  const auto t0 = std::chrono::steady_clock::now();
  // What the graph's device allows: an in-place row-local read only where its tiles hold whole rows.
  FusionLimits device_limits = limits;
  device_limits.whole_row_tiles = limits.whole_row_tiles && runtime(canonical.device).fused_tiles_hold_whole_rows();
  std::vector<LaunchGroup> groups = partition(canonical, device_limits);
  auto out = finish_compiled_graph(std::move(canonical), std::move(groups), plan_memory);
  std::const_pointer_cast<CompiledGraph>(out)->compile_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::shared_ptr<const CompiledGraph> finish_compiled_graph(Graph canonical, std::vector<LaunchGroup> groups,
                                                           bool plan_memory) {
  const auto t0 = std::chrono::steady_clock::now();
  auto out = std::make_shared<CompiledGraph>();
  out->groups = std::move(groups);
  out->graph = std::move(canonical);
  // Every kernel must exist before anything runs, so a missing one fails at the flush.
  for (const LaunchGroup& grp : out->groups) {
    std::vector<int> ops = grp.chain;
    if (grp.kind == LaunchGroup::Kind::single_op) ops.push_back(out->graph.node_of(grp.result));
    for (int n : ops) {
      const GraphNode& node = out->graph.nodes[size_t(n)];
      std::vector<OperandMeta> args;
      for (int a : node.args) args.push_back({out->graph.shape_of(a), out->graph.dtype_of(a)});
      runtime_for(node.op, out->graph.device, args);
    }
  }
  // Liveness: the last group reading each value (every value a group's launch binds).
  const Graph& g = out->graph;
  std::vector<int> last(size_t(g.num_values()), -1);
  for (size_t i = 0; i < out->groups.size(); ++i) {
    const LaunchGroup& grp = out->groups[i];
    std::vector<int> reads = grp.group_inputs;
    for (int n : grp.chain)
      for (int a : g.nodes[size_t(n)].args) reads.push_back(a);
    if (grp.into >= 0) reads.push_back(grp.into);
    if (grp.alias_base >= 0) reads.push_back(grp.alias_base);
    for (int v : reads) last[size_t(v)] = int(i);
    for (int v : grp.batch) last[size_t(v)] = std::max(last[size_t(v)], int(i));
    last[size_t(grp.result)] = std::max(last[size_t(grp.result)], int(i));
  }
  for (int o : g.outputs) last[size_t(o)] = -1;  // kept to the end
  out->release_after.assign(out->groups.size(), {});
  for (int v = 0; v < g.num_values(); ++v)
    if (last[size_t(v)] >= 0) out->release_after[size_t(last[size_t(v)])].push_back(v);
  if (plan_memory) out->memory = kiln::plan_memory(g, out->groups);
  out->compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::string describe_launches(const CompiledGraph& compiled) {
  const Graph& g = compiled.graph;
  std::ostringstream os;
  auto name_of = [&](int v) { return g.is_input(v) ? std::string("input") : g.nodes[size_t(g.node_of(v))].op; };
  for (const LaunchGroup& grp : compiled.groups) {
    const bool launches = grp.launches();
    os << "  " << (launches ? grp.launch_name(g)
                            : grp.kind == LaunchGroup::Kind::view    ? "view"
                            : grp.kind == LaunchGroup::Kind::alias   ? "alias"
                            : grp.kind == LaunchGroup::Kind::batched ? "batched"
                                                                     : "assembled")
       << " %" << grp.result;
    if (!grp.nodes.empty()) {
      os << " [";
      for (size_t i = 0; i < grp.nodes.size(); ++i) os << (i ? " " : "") << g.nodes[size_t(grp.nodes[i])].op;
      os << "]";
    }
    os << " <-";
    std::vector<int> reads = grp.group_inputs;
    for (int n : grp.chain)
      for (int a : g.nodes[size_t(n)].args) reads.push_back(a);
    for (int v : reads)
      if (std::find(grp.internal.begin(), grp.internal.end(), v) == grp.internal.end())
        os << " " << name_of(v) << "%" << v;
    os << " -> " << to_string(g.shape_of(grp.result));
    if (grp.into >= 0) os << " into %" << grp.into << "+" << grp.into_offset;
    if (!grp.into_strides.empty()) os << " strides " << to_string(grp.into_strides);
    for (int v : grp.batch) os << " +%" << v;
    os << "\n";
  }
  return os.str();
}

namespace {

Tensor allocate(DeviceRuntime& rt, const GraphNode& node) {
  return Tensor::view_of(rt.allocate(size_t(numel(node.shape)) * dtype_size(node.dtype)), node.shape, node.dtype);
}

std::vector<TensorView> views_of(const std::vector<Tensor>& ts) {
  std::vector<TensorView> v;
  v.reserve(ts.size());
  for (const Tensor& t : ts) v.push_back(TensorView::of(t));
  return v;
}

// Enqueues `work` (which holds every tensor it touches) and marks `outs` ready at its completion.
// `ins`: what it reads, for the profile's bytes (exec/profile.h).
// One work item on the queue, running `kernels` kernels (an epilogue's chain and fused pass).
void launch(DeviceRuntime& rt, const std::string& name, const std::vector<Tensor>& outs, std::function<void()> work,
            const std::vector<Tensor>& ins = {}, uint64_t kernels = 1) {
  if (profiling()) work = detail::profiled(name, detail::operand_bytes(ins) + detail::operand_bytes(outs), std::move(work));
  size_t output_bytes = 0;
  for (const Tensor& out : outs) output_bytes += size_t(out.numel()) * dtype_size(out.dtype());
  const uint64_t seq = rt.enqueue(name, std::move(work), output_bytes);
  for (const Tensor& out : outs) out.buffer()->set_ready_seq(seq);
  detail::count_kernel(name, kernels);
}
void launch(DeviceRuntime& rt, const std::string& name, const Tensor& out, std::function<void()> work,
            const std::vector<Tensor>& ins = {}, uint64_t kernels = 1) {
  launch(rt, name, std::vector<Tensor>{out}, std::move(work), ins, kernels);
}

std::vector<Tensor> flattened(const std::vector<std::vector<Tensor>>& groups) {
  std::vector<Tensor> all;
  for (const auto& g : groups) all.insert(all.end(), g.begin(), g.end());
  return all;
}

Tensor dense_copy(DeviceRuntime& rt, const Tensor& t) {
  GraphNode meta;
  meta.shape = t.shape();
  meta.dtype = t.dtype();
  const Tensor out = allocate(rt, meta);
  const KernelFn copy = rt.kernel("copy");
  launch(rt, "copy", out, [copy, t, out] {
    KernelArgs args;
    args.in = {TensorView::of(t)};
    args.out = TensorView::of(out);
    Attrs none;
    args.attrs = &none;
    copy(args);
  }, {t});
  return out;
}

}  // namespace

std::vector<Tensor> run_graph(const std::shared_ptr<const CompiledGraph>& compiled, const std::vector<Tensor>& inputs,
                              bool dense_outputs, const std::vector<bool>& weights) {
  const Graph& g = compiled->graph;
  KILN_CHECK(int(inputs.size()) == g.num_inputs(), "graph", "run with ", inputs.size(), " inputs, the graph has ",
             g.num_inputs());
  for (int i = 0; i < g.num_inputs(); ++i) {
    const GraphInput& in = g.inputs[size_t(i)];
    const Tensor& t = inputs[size_t(i)];
    KILN_CHECK(t.shape() == in.shape && t.dtype() == in.dtype && t.strides() == in.strides, "graph", "input ", i,
               " is ", t.describe(), " strides ", to_string(t.strides()), ", the graph expects ", dtype_name(in.dtype),
               to_string(in.shape), " strides ", to_string(in.strides));
    KILN_CHECK(t.device() == g.device, "graph", "input ", i, " is on ", t.device().str(), ", the graph runs on ",
               g.device.str());
  }
  const Device device = g.device;
  DeviceRuntime& rt = runtime(device);
  // A device that compiles whole programs takes the graph as it is (XLA fuses and plans memory).
  if (rt.runs_whole_graphs()) {
    std::vector<Tensor> results = rt.run_whole_graph(g, inputs);
    detail::count_kernel("whole_graph");
    return results;
  }
  std::vector<Tensor> val(size_t(g.num_values()));
  for (int i = 0; i < g.num_inputs(); ++i) val[size_t(i)] = inputs[size_t(i)];
  auto gather = [&](const std::vector<int>& ids) {
    std::vector<Tensor> ts;
    ts.reserve(ids.size());
    for (int v : ids) ts.push_back(val[size_t(v)]);
    return ts;
  };

  // Compiled mode: one arena, each planned value at its offset (memory_plan.h).
  const MemoryPlan& plan = compiled->memory;
  BufferPtr arena;
  if (plan.arena_bytes > 0) arena = rt.allocate(plan.arena_bytes);
  auto fresh = [&](int v) {
    const GraphNode& node = g.nodes[size_t(g.node_of(v))];
    if (plan.empty() || plan.offset[size_t(v)] < 0) return allocate(rt, node);
    return Tensor::view_of(arena, node.shape, node.dtype, {}, plan.offset[size_t(v)] / int64_t(dtype_size(node.dtype)));
  };
  // A linear on the GEMM primitive (kernels/linear_gemm.h) whose weight is a module weight
  // (`weights`) reads it pre-packed. The packing happens on the queue, for the bytes as they are
  // when the launch is enqueued.
  struct Prepack {
    Tensor w;  // undefined: none
    uint64_t after_write = 0;
  };
  auto prepack_of = [&](const GraphNode& op) {
    Prepack p;
    if (op.op != "linear" || weights.empty() || op.shape.back() == 0) return p;
    const int w = op.args.at(1);
    if (!rt.linear_reads_prepared_weight(numel(op.shape) / op.shape.back(), g.dtype_of(op.args.at(0)), g.dtype_of(w)))
      return p;
    if (!g.is_input(w) || !weights.at(size_t(w))) return p;
    p.w = val[size_t(w)];
    p.after_write = p.w.buffer()->ready_seq();
    return p;
  };
  DeviceRuntime* const dev = &rt;  // lives for the process: queued work may hold it
  auto run_kernel = [dev](KernelFn kernel, KernelArgs& args, const Prepack& p) {
    std::shared_ptr<const void> packed;
    if (p.w.defined()) packed = dev->prepared_linear_weight(p.w, p.after_write);
    args.prepared = packed.get();
    kernel(args);
  };
  // Output buffers of concats whose inputs write into them (LaunchGroup::into), by value id.
  std::map<int, Tensor> assembled;
  auto target = [&](int v) -> const Tensor& {
    auto it = assembled.find(v);
    if (it == assembled.end()) it = assembled.emplace(v, fresh(v)).first;
    return it->second;
  };
  // The group's output: a fresh buffer, or its dense slice of a concat's buffer.
  auto output_of = [&](const LaunchGroup& grp, const GraphNode& node) {
    if (grp.into < 0) return fresh(grp.result);
    const Tensor& whole = target(grp.into);
    return Tensor::view_of(whole.buffer(), node.shape, node.dtype, grp.into_strides, whole.offset() + grp.into_offset);
  };

  for (size_t gi = 0; gi < compiled->groups.size(); ++gi) {
    const LaunchGroup& grp = compiled->groups[gi];
    const GraphNode& node = g.nodes[size_t(g.node_of(grp.result))];
    switch (grp.kind) {
      case LaunchGroup::Kind::view: {
        const Tensor& base = val[size_t(grp.group_inputs.at(0))];
        KILN_CHECK(base.is_contiguous(), "graph", "view of a non-dense value ", base.describe());
        val[size_t(grp.result)] = Tensor::view_of(base.buffer(), node.shape, node.dtype,
                                                  node.attrs.get_ints("strides"),
                                                  base.offset() + node.attrs.get_int("offset"));
        break;
      }
      case LaunchGroup::Kind::alias: {
        const Tensor& base = val[size_t(grp.alias_base)];
        KILN_CHECK(base.is_contiguous(), "graph", "alias of a non-dense value ", base.describe());
        val[size_t(grp.result)] = Tensor::view_of(base.buffer(), node.shape, node.dtype, {}, base.offset());
        break;
      }
      case LaunchGroup::Kind::assembled:
        val[size_t(grp.result)] = target(grp.result);  // its inputs already wrote their slices
        break;
      case LaunchGroup::Kind::batched: break;  // its grouped launch set it
      case LaunchGroup::Kind::single_op: {
        if (!grp.batch.empty()) {  // single-row linears reading one row: one grouped GEMV
          std::vector<int> results = {grp.result};
          results.insert(results.end(), grp.batch.begin(), grp.batch.end());
          std::vector<std::vector<Tensor>> ins;  // per linear: x, w[, b]
          std::vector<Tensor> outs;
          for (int v : results) {
            ins.push_back(gather(g.nodes[size_t(g.node_of(v))].args));
            outs.push_back(fresh(v));
            val[size_t(v)] = outs.back();
          }
          launch(rt, grp.launch_name(g), outs, [compiled, ins, outs, dev] {
            std::vector<KernelArgs> args(outs.size());
            for (size_t i = 0; i < outs.size(); ++i) {
              args[i].in = views_of(ins[i]);
              args[i].out = TensorView::of(outs[i]);
            }
            dev->grouped_linear_rows(args);
          }, profiling() ? flattened(ins) : std::vector<Tensor>{});
          break;
        }
        const Tensor out = output_of(grp, node);
        const KernelFn kernel = rt.kernel(node.op);
        const std::vector<Tensor> ins = gather(grp.group_inputs);
        launch(
            rt, node.op, out,
            [compiled, kernel, ins, out, &attrs = node.attrs, pp = prepack_of(node), run_kernel] {
              KernelArgs args;
              args.in = views_of(ins);
              args.out = TensorView::of(out);
              args.attrs = &attrs;
              run_kernel(kernel, args, pp);
            },
            ins);
        val[size_t(grp.result)] = out;
        break;
      }
      case LaunchGroup::Kind::fused_elementwise: {
        const Tensor out = output_of(grp, node);
        const std::vector<Tensor> ins = gather(grp.group_inputs);
        launch(
            rt, "fused_elementwise", out,
            [compiled, &program = grp.program, ins, out, dev] {
              dev->fused_elementwise(program, views_of(ins), TensorView::of(out));
            },
            ins);
        val[size_t(grp.result)] = out;
        break;
      }
      case LaunchGroup::Kind::epilogue: {
        const Tensor out = output_of(grp, node);
        // Values living in the output buffer are read as that buffer, in their own shape.
        auto bind = [&](int v) {
          const bool inside = std::find(grp.internal.begin(), grp.internal.end(), v) != grp.internal.end();
          return inside ? Tensor::view_of(out.buffer(), g.shape_of(v), g.dtype_of(v), {}, out.offset())
                        : val[size_t(v)];
        };
        struct Step {
          KernelFn kernel;
          const Attrs* attrs;
          std::vector<Tensor> in;
          Tensor out;
          Prepack prepack;
        };
        std::vector<Step> steps;
        for (int n : grp.chain) {
          const GraphNode& op = g.nodes[size_t(n)];
          Step st{rt.kernel(op.op), &op.attrs, {}, bind(g.value_of_node(n)), prepack_of(op)};
          for (int a : op.args) st.in.push_back(bind(a));
          steps.push_back(std::move(st));
        }
        std::vector<Tensor> ins;
        Tensor program_out = out;
        if (grp.slice_axis < 0) {
          for (int v : grp.group_inputs) ins.push_back(bind(v));
        } else {
          // The program computes rows [begin, begin + len) along the axis of `into`: its output is
          // those rows (where the chain just wrote), its inputs are cut to the same rows, and the
          // chain's value is read through the (row-local) views the program loads it by.
          const auto axis = size_t(grp.slice_axis);
          auto rows = [&](Shape s) {
            s[axis] = grp.slice_len;
            return s;
          };
          const Shape& whole = g.shape_of(grp.into);
          program_out = Tensor::view_of(out.buffer(), rows(whole), node.dtype, {}, out.offset());
          for (int v : grp.group_inputs) {
            const int vn = g.node_of(v);
            if (std::find(grp.internal.begin(), grp.internal.end(), v) != grp.internal.end()) {
              const GraphNode& view = g.nodes[size_t(vn)];
              ins.push_back(Tensor::view_of(out.buffer(), rows(view.shape), view.dtype, view.attrs.get_ints("strides"),
                                            out.offset() + view.attrs.get_int("offset")));
              continue;
            }
            const Tensor& t = val[size_t(v)];
            const int64_t d = int64_t(axis) - int64_t(whole.size() - t.shape().size());
            if (d < 0 || t.shape()[size_t(d)] == 1) {
              ins.push_back(t);
              continue;
            }
            Shape shape = t.shape();
            shape[size_t(d)] = grp.slice_len;
            ins.push_back(Tensor::view_of(t.buffer(), shape, t.dtype(), t.strides(),
                                          t.offset() + grp.slice_begin * t.strides()[size_t(d)]));
          }
        }
        std::vector<Tensor> read;  // for the profile: the chain's and the program's inputs
        if (profiling()) {
          read = ins;
          for (const Step& st : steps) read.insert(read.end(), st.in.begin(), st.in.end());
        }
        const uint64_t kernels = steps.size() + (grp.program.instrs.empty() ? 0 : 1);
        launch(rt, grp.launch_name(g), out,
               [compiled, steps = std::move(steps), &program = grp.program, ins = std::move(ins), out, program_out,
                run_kernel, dev] {
                 for (const Step& st : steps) {
                   KernelArgs args;
                   args.in = views_of(st.in);
                   args.out = TensorView::of(st.out);
                   args.attrs = st.attrs;
                   run_kernel(st.kernel, args, st.prepack);
                 }
                 if (!program.instrs.empty())
                   dev->fused_elementwise(program, views_of(ins), TensorView::of(program_out));
               },
               read, kernels);
        val[size_t(grp.result)] = out;
        break;
      }
    }
    for (int v : compiled->release_after[gi]) {
      val[size_t(v)] = Tensor();
      assembled.erase(v);
    }
  }

  std::vector<Tensor> outs;
  outs.reserve(g.outputs.size());
  for (int o : g.outputs) {
    const Tensor& t = val[size_t(o)];
    const bool owned = !dense_outputs || (!g.is_input(o) && t.is_contiguous() && t.offset() == 0);
    outs.push_back(owned ? t : dense_copy(rt, t));
  }
  return outs;
}

}  // namespace kiln
