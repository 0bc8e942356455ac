#include "devices/pjrt/programs.h"

#include <map>

#include "core/error.h"
#include "devices/pjrt/lower_ops.h"
#include "graph/graph.h"

namespace kiln::pjrt {

namespace {

Value bytes_arg(FunctionBuilder& b, size_t bytes) { return b.arg({int64_t(bytes)}, "ui8"); }

// `count` elements of `dtype` from their bytes.
Value typed(FunctionBuilder& b, const Value& bytes, int64_t count, DType dtype) {
  if (dtype == DType::boolean) return b.compare("NE", bytes, b.splat(0, bytes.shape, "ui8"));
  const int64_t e = int64_t(dtype_size(dtype));
  return b.bitcast(b.reshape(bytes, {count, e}), {count}, element_type(dtype));
}

// A dense value's bytes, as kiln stores its dtype (bool: one byte, 0 or 1).
Value to_bytes(FunctionBuilder& b, const Value& v, DType dtype) {
  const Value flat = b.reshape(v, {v.numel()});
  if (dtype == DType::boolean) return b.convert(flat, "ui8");
  const int64_t e = int64_t(dtype_size(dtype));
  return b.reshape(b.bitcast(flat, {v.numel(), e}, "ui8"), {v.numel() * e});
}

// The tensor `view` of argument buffer `bytes`, as a dense value.
Value load(FunctionBuilder& b, const Value& bytes, const ByteView& view) {
  if (numel(view.shape) == 0) return b.splat(0, view.shape, element_type(view.dtype));
  int64_t lo = 0, hi = 0;
  for (size_t d = 0; d < view.shape.size(); ++d) {
    if (view.shape[d] <= 1) continue;
    const int64_t span = (view.shape[d] - 1) * view.strides[d];
    (span < 0 ? lo : hi) += span;
  }
  const int64_t e = int64_t(dtype_size(view.dtype)), count = hi - lo + 1;
  const int64_t first = view.byte_offset + lo * e;
  KILN_CHECK(first >= 0 && first + count * e <= bytes.shape[0], "pjrt", "a ", dtype_name(view.dtype),
             to_string(view.shape), " view reaches bytes [", first, ", ", first + count * e, ") of a ", bytes.shape[0],
             "-byte buffer");
  const Value window = b.slice(bytes, {first}, {first + count * e}, {1});
  return strided_view(b, typed(b, window, count, view.dtype), -lo, view.shape, view.strides);
}

// Every node of `g` in order, into val (its inputs' values already there).
void lower_nodes(FunctionBuilder& b, const Graph& g, std::vector<Value>& val, int replicas) {
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const GraphNode& node = g.nodes[n];
    Value& out = val[size_t(g.value_of_node(int(n)))];
    if (node.op == "view") {  // shape/strides/offset in elements of the viewed value's dense layout
      const Value& base = val[size_t(node.args[0])];
      out = strided_view(b, b.reshape(base, {base.numel()}), node.attrs.get_int("offset"), node.shape,
                         node.attrs.get_ints("strides"));
      continue;
    }
    std::vector<Value> in;
    for (int a : node.args) in.push_back(val[size_t(a)]);
    out = lower_op(b, node.op, node.attrs, in, node.shape, node.dtype, replicas);
  }
}

}  // namespace

std::string op_program(const OpProgramSpec& spec) {
  FunctionBuilder b;
  std::vector<Value> args;
  for (size_t bytes : spec.arg_bytes) args.push_back(bytes_arg(b, bytes));
  std::vector<Value> in;
  for (const ByteView& v : spec.inputs) in.push_back(load(b, args[size_t(v.arg)], v));
  const Value result = lower_op(b, spec.op, spec.attrs, in, spec.out.shape, spec.out.dtype, spec.replicas);
  Value bytes = to_bytes(b, result, spec.out.dtype);
  const auto finish = [&](const Value& v, const std::vector<int>& aliases) {
    return spec.replicas == 1 ? b.finish({v}, aliases) : b.finish_module({v}, spec.replicas, aliases);
  };
  if (spec.out.arg < 0) {
    const int64_t pad = int64_t(spec.out_bytes) - bytes.shape[0];
    if (pad > 0) bytes = b.pad(bytes, 0, {0}, {pad});
    return finish(bytes, {});
  }
  const Value updated = b.dynamic_update_slice(args[size_t(spec.out.arg)], bytes, spec.out.byte_offset);
  return finish(updated, {spec.out.arg});
}

std::string graph_program(const Graph& g, const std::vector<size_t>& arg_bytes, const std::vector<ByteView>& inputs,
                          int replicas) {
  FunctionBuilder b;
  std::vector<Value> args;
  for (size_t bytes : arg_bytes) args.push_back(bytes_arg(b, bytes));
  std::vector<Value> val(size_t(g.num_values()));
  for (int i = 0; i < g.num_inputs(); ++i) val[size_t(i)] = load(b, args[size_t(inputs[size_t(i)].arg)], inputs[size_t(i)]);
  lower_nodes(b, g, val, replicas);
  std::vector<Value> results;
  for (int v : g.outputs) results.push_back(to_bytes(b, val[size_t(v)], g.dtype_of(v)));
  return replicas == 1 ? b.finish(results) : b.finish_module(results, replicas);
}

std::string typed_graph_program(const Graph& g, int replicas) {
  FunctionBuilder b;
  std::vector<Value> val(size_t(g.num_values()));
  for (int i = 0; i < g.num_inputs(); ++i) val[size_t(i)] = b.arg(g.shape_of(i), element_type(g.dtype_of(i)));
  lower_nodes(b, g, val, replicas);
  std::vector<Value> results;
  for (int v : g.outputs) results.push_back(val[size_t(v)]);
  return b.finish_module(results, replicas);
}

std::string copy_program(size_t src_bytes, size_t src_offset, size_t dst_bytes, size_t dst_offset, size_t bytes) {
  FunctionBuilder b;
  const Value src = bytes_arg(b, src_bytes), dst = bytes_arg(b, dst_bytes);
  const Value part = b.slice(src, {int64_t(src_offset)}, {int64_t(src_offset + bytes)}, {1});
  return b.finish({b.dynamic_update_slice(dst, part, int64_t(dst_offset))}, {1});
}

std::string zeros_program(size_t bytes) {
  FunctionBuilder b;
  return b.finish({b.splat(0, {int64_t(bytes)}, "ui8")});
}

}  // namespace kiln::pjrt
