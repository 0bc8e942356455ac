#include "devices/pjrt/stablehlo.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace kiln::pjrt {

namespace {

std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}
std::string bracketed(const std::vector<int64_t>& v) {
  std::string s = "[";
  s += list(v);
  s += ']';
  return s;
}
std::string i64_array(const std::vector<int64_t>& v) {
  if (v.empty()) return "array<i64>";
  std::string s = "array<i64: ";
  s += list(v);
  s += '>';
  return s;
}

// A scalar literal of `elem` exactly: floats by their bit pattern (infinities included).
std::string literal(double value, const std::string& elem) {
  char buf[40];
  if (elem == "f32") {
    const float f = float(value);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    std::snprintf(buf, sizeof buf, "0x%08" PRIX32, bits);
  } else if (elem == "f64") {
    uint64_t bits;
    std::memcpy(&bits, &value, 8);
    std::snprintf(buf, sizeof buf, "0x%016" PRIX64, bits);
  } else if (elem == "bf16") {
    std::snprintf(buf, sizeof buf, "0x%04X", unsigned(f32_to_bf16(float(value))));
  } else if (elem == "f16") {
    std::snprintf(buf, sizeof buf, "0x%04X", unsigned(f32_to_f16(float(value))));
  } else if (elem == "i1") {
    return value != 0 ? "true" : "false";
  } else {
    std::snprintf(buf, sizeof buf, "%" PRId64, int64_t(value));
  }
  return buf;
}

}  // namespace

std::string element_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "i1";
    default: fail("pjrt", dtype_name(dtype), " tensors have no StableHLO element type (a storage-only type)");
  }
}

std::string tensor_type(const Shape& shape, const std::string& elem) {
  std::string s = "tensor<";
  for (int64_t d : shape) s += std::to_string(d) + "x";
  return s + elem + ">";
}

bool is_float_elem(const std::string& elem) { return elem == "f32" || elem == "bf16" || elem == "f16" || elem == "f64"; }

Value FunctionBuilder::arg(const Shape& shape, const std::string& elem) {
  Value v{"%a" + std::to_string(args_.size()), shape, elem};
  args_.push_back(v);
  return v;
}

Value FunctionBuilder::emit(const std::string& rhs, const Shape& shape, const std::string& elem) {
  Value v{"%v" + std::to_string(next_++), shape, elem};
  body_ << "  " << v.id << " = " << rhs << "\n";
  return v;
}

std::string FunctionBuilder::finish(const std::vector<Value>& results, const std::vector<int>& aliases) const {
  std::ostringstream os;
  os << "func.func public @main(";
  for (size_t i = 0; i < args_.size(); ++i) {
    os << (i ? ", " : "") << args_[i].id << ": " << type_of(args_[i]);
    for (size_t r = 0; r < aliases.size(); ++r)
      if (aliases[r] == int(i)) os << " {tf.aliasing_output = " << r << " : i32}";
  }
  os << ") -> (";
  for (size_t i = 0; i < results.size(); ++i) os << (i ? ", " : "") << type_of(results[i]);
  os << ") {\n" << body_.str() << "  return ";
  for (size_t i = 0; i < results.size(); ++i) os << (i ? ", " : "") << results[i].id;
  os << " : ";
  for (size_t i = 0; i < results.size(); ++i) os << (i ? ", " : "") << type_of(results[i]);
  os << "\n}\n";
  return os.str();
}

std::string FunctionBuilder::finish_module(const std::vector<Value>& results, int replicas,
                                           const std::vector<int>& aliases) const {
  return "module @kiln attributes {mhlo.num_replicas = " + std::to_string(replicas) +
         " : i32, mhlo.num_partitions = 1 : i32} {\n" + finish(results, aliases) + "}\n";
}

Value FunctionBuilder::constant(double value, const std::string& elem) { return splat(value, {}, elem); }

Value FunctionBuilder::splat(double value, const Shape& shape, const std::string& elem) {
  return emit("stablehlo.constant dense<" + literal(value, elem) + "> : " + tensor_type(shape, elem), shape, elem);
}

Value FunctionBuilder::convert(const Value& v, const std::string& elem) {
  if (v.elem == elem) return v;
  if (elem == "i1") return compare("NE", v, splat(0, v.shape, v.elem));  // nonzero is true
  return emit("stablehlo.convert " + v.id + " : (" + type_of(v) + ") -> " + tensor_type(v.shape, elem), v.shape, elem);
}

Value FunctionBuilder::bitcast(const Value& v, const Shape& shape, const std::string& elem) {
  return emit("stablehlo.bitcast_convert " + v.id + " : (" + type_of(v) + ") -> " + tensor_type(shape, elem), shape,
              elem);
}

Value FunctionBuilder::reshape(const Value& v, const Shape& shape) {
  if (v.shape == shape) return v;
  return emit("stablehlo.reshape " + v.id + " : (" + type_of(v) + ") -> " + tensor_type(shape, v.elem), shape, v.elem);
}

Value FunctionBuilder::transpose(const Value& v, const std::vector<int64_t>& perm) {
  bool identity = true;
  Shape shape(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) {
    shape[i] = v.shape[size_t(perm[i])];
    identity = identity && perm[i] == int64_t(i);
  }
  if (identity) return v;
  return emit("stablehlo.transpose " + v.id + ", dims = " + bracketed(perm) + " : (" + type_of(v) + ") -> " +
                  tensor_type(shape, v.elem),
              shape, v.elem);
}

Value FunctionBuilder::broadcast_in_dim(const Value& v, const Shape& shape, const std::vector<int64_t>& dims) {
  return emit("stablehlo.broadcast_in_dim " + v.id + ", dims = " + bracketed(dims) + " : (" + type_of(v) + ") -> " +
                  tensor_type(shape, v.elem),
              shape, v.elem);
}

Value FunctionBuilder::broadcast_to(const Value& v, const Shape& shape) {
  if (v.shape == shape) return v;
  KILN_CHECK(v.shape.size() <= shape.size(), "pjrt", "cannot broadcast ", to_string(v.shape), " to ", to_string(shape));
  std::vector<int64_t> dims;
  const size_t lead = shape.size() - v.shape.size();
  for (size_t i = 0; i < v.shape.size(); ++i) dims.push_back(int64_t(lead + i));
  return broadcast_in_dim(v, shape, dims);
}

Value FunctionBuilder::slice(const Value& v, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
                             const std::vector<int64_t>& strides) {
  Shape shape(start.size());
  bool whole = true;
  for (size_t i = 0; i < start.size(); ++i) {
    shape[i] = limit[i] > start[i] ? (limit[i] - start[i] + strides[i] - 1) / strides[i] : 0;
    whole = whole && start[i] == 0 && limit[i] == v.shape[i] && strides[i] == 1;
  }
  if (whole) return v;
  return emit("\"stablehlo.slice\"(" + v.id + ") {start_indices = " + i64_array(start) + ", limit_indices = " +
                  i64_array(limit) + ", strides = " + i64_array(strides) + "} : (" + type_of(v) + ") -> " +
                  tensor_type(shape, v.elem),
              shape, v.elem);
}

Value FunctionBuilder::reverse(const Value& v, const std::vector<int64_t>& dims) {
  return emit("stablehlo.reverse " + v.id + ", dims = " + bracketed(dims) + " : " + type_of(v), v.shape, v.elem);
}

Value FunctionBuilder::concatenate(const std::vector<Value>& vs, int64_t dim) {
  if (vs.size() == 1) return vs[0];
  Shape shape = vs[0].shape;
  shape[size_t(dim)] = 0;
  std::string ids, types;
  for (size_t i = 0; i < vs.size(); ++i) {
    shape[size_t(dim)] += vs[i].shape[size_t(dim)];
    ids += (i ? ", " : "") + vs[i].id;
    types += (i ? ", " : "") + type_of(vs[i]);
  }
  return emit("stablehlo.concatenate " + ids + ", dim = " + std::to_string(dim) + " : (" + types + ") -> " +
                  tensor_type(shape, vs[0].elem),
              shape, vs[0].elem);
}

Value FunctionBuilder::pad(const Value& v, double value, const std::vector<int64_t>& low,
                           const std::vector<int64_t>& high) {
  const Value pv = constant(value, v.elem);
  Shape shape = v.shape;
  for (size_t i = 0; i < shape.size(); ++i) shape[i] += low[i] + high[i];
  return emit("stablehlo.pad " + v.id + ", " + pv.id + ", low = " + bracketed(low) + ", high = " + bracketed(high) +
                  ", interior = " + bracketed(std::vector<int64_t>(low.size(), 0)) + " : (" + type_of(v) + ", " +
                  type_of(pv) + ") -> " + tensor_type(shape, v.elem),
              shape, v.elem);
}

Value FunctionBuilder::iota(const Shape& shape, int64_t dim, const std::string& elem) {
  return emit("stablehlo.iota dim = " + std::to_string(dim) + " : " + tensor_type(shape, elem), shape, elem);
}

Value FunctionBuilder::unary(const std::string& op, const Value& a) {
  if (op == "chlo.erf") return emit(op + " " + a.id + " : " + type_of(a) + " -> " + type_of(a), a.shape, a.elem);
  return emit(op + " " + a.id + " : " + type_of(a), a.shape, a.elem);
}

Value FunctionBuilder::binary(const std::string& op, const Value& a, const Value& b) {
  return emit(op + " " + a.id + ", " + b.id + " : " + type_of(a), a.shape, a.elem);
}

Value FunctionBuilder::compare(const std::string& direction, const Value& a, const Value& b) {
  return emit("stablehlo.compare " + direction + ", " + a.id + ", " + b.id + " : (" + type_of(a) + ", " + type_of(b) +
                  ") -> " + tensor_type(a.shape, "i1"),
              a.shape, "i1");
}

Value FunctionBuilder::select(const Value& cond, const Value& a, const Value& b) {
  return emit("stablehlo.select " + cond.id + ", " + a.id + ", " + b.id + " : (" + type_of(cond) + ", " + type_of(a) +
                  ", " + type_of(b) + ") -> " + type_of(a),
              a.shape, a.elem);
}

Value FunctionBuilder::reduce(const Value& v, const std::vector<int64_t>& dims, const std::string& op, double init) {
  const Value i = constant(init, v.elem);
  Shape shape;
  for (size_t d = 0; d < v.shape.size(); ++d) {
    bool reduced = false;
    for (int64_t r : dims) reduced = reduced || r == int64_t(d);
    if (!reduced) shape.push_back(v.shape[d]);
  }
  return emit("stablehlo.reduce(" + v.id + " init: " + i.id + ") applies " + op + " across dimensions = " +
                  bracketed(dims) + " : (" + type_of(v) + ", " + type_of(i) + ") -> " + tensor_type(shape, v.elem),
              shape, v.elem);
}

Value FunctionBuilder::dot_general(const Value& a, const Value& b, const std::vector<int64_t>& batch_a,
                                   const std::vector<int64_t>& batch_b, const std::vector<int64_t>& contract_a,
                                   const std::vector<int64_t>& contract_b, const Shape& out) {
  std::string rhs = "stablehlo.dot_general " + a.id + ", " + b.id + ", ";
  if (!batch_a.empty()) rhs += "batching_dims = " + bracketed(batch_a) + " x " + bracketed(batch_b) + ", ";
  rhs += "contracting_dims = " + bracketed(contract_a) + " x " + bracketed(contract_b) +
         ", precision = [HIGHEST, HIGHEST] : (" + type_of(a) + ", " + type_of(b) + ") -> " + tensor_type(out, a.elem);
  return emit(rhs, out, a.elem);
}

Value FunctionBuilder::conv2d(const Value& x, const Value& w, const std::vector<int64_t>& stride,
                              const std::vector<int64_t>& padding, bool channels_last, const Shape& out) {
  const std::string layout = channels_last ? "[b, 0, 1, f]" : "[b, f, 0, 1]";
  return emit("stablehlo.convolution(" + x.id + ", " + w.id + ") dim_numbers = " + layout + "x[o, i, 0, 1]->" +
                  layout + ", window = {stride = " + bracketed(stride) + ", pad = [[" + std::to_string(padding[0]) +
                  ", " + std::to_string(padding[0]) + "], [" + std::to_string(padding[1]) + ", " +
                  std::to_string(padding[1]) +
                  "]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64, precision_config = "
                  "[#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]} : (" +
                  type_of(x) + ", " + type_of(w) + ") -> " + tensor_type(out, x.elem),
              out, x.elem);
}

Value FunctionBuilder::take_rows(const Value& table, const Value& indices) {
  Shape out = indices.shape;
  std::vector<int64_t> offset_dims, slice_sizes{1};
  for (size_t d = 1; d < table.shape.size(); ++d) {
    offset_dims.push_back(int64_t(indices.shape.size() + d - 1));
    out.push_back(table.shape[d]);
    slice_sizes.push_back(table.shape[d]);
  }
  return emit("\"stablehlo.gather\"(" + table.id + ", " + indices.id +
                  ") {dimension_numbers = #stablehlo.gather<offset_dims = " + bracketed(offset_dims) +
                  ", collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = " +
                  std::to_string(indices.shape.size()) + ">, indices_are_sorted = false, slice_sizes = " +
                  i64_array(slice_sizes) + "} : (" + type_of(table) + ", " + type_of(indices) + ") -> " +
                  tensor_type(out, table.elem),
              out, table.elem);
}

Value FunctionBuilder::dynamic_update_slice(const Value& v, const Value& update, int64_t offset) {
  const Value at = constant(double(offset), "i64");
  return emit("stablehlo.dynamic_update_slice " + v.id + ", " + update.id + ", " + at.id + " : (" + type_of(v) + ", " +
                  type_of(update) + ", " + type_of(at) + ") -> " + type_of(v),
              v.shape, v.elem);
}

}  // namespace kiln::pjrt

namespace kiln::pjrt {

namespace {
std::string every_replica(int replicas) {
  std::string ids;
  for (int r = 0; r < replicas; ++r) ids += (r ? ", " : "") + std::to_string(r);
  return "replica_groups = dense<[[" + ids + "]]> : tensor<1x" + std::to_string(replicas) + "xi64>";
}
}  // namespace

Value FunctionBuilder::all_reduce_sum(const Value& v, int replicas) {
  // The reduction region's arguments get names of their own: a region may not redefine a name
  // its function already has.
  const std::string a = "%r" + std::to_string(next_) + "a", c = "%r" + std::to_string(next_) + "b",
                    s = "%r" + std::to_string(next_) + "s", scalar = tensor_type({}, v.elem);
  return emit("\"stablehlo.all_reduce\"(" + v.id + ") ({\n  ^bb0(" + a + ": " + scalar + ", " + c + ": " + scalar +
                  "):\n    " + s + " = stablehlo.add " + a + ", " + c + " : " + scalar + "\n    stablehlo.return " + s +
                  " : " + scalar + "\n  }) {" + every_replica(replicas) + "} : (" + type_of(v) + ") -> " + type_of(v),
              v.shape, v.elem);
}

Value FunctionBuilder::all_gather(const Value& v, int64_t dim, int replicas) {
  Shape shape = v.shape;
  shape[size_t(dim)] *= replicas;
  return emit("\"stablehlo.all_gather\"(" + v.id + ") {all_gather_dim = " + std::to_string(dim) + " : i64, " +
                  every_replica(replicas) + "} : (" + type_of(v) + ") -> " + tensor_type(shape, v.elem),
              shape, v.elem);
}

}  // namespace kiln::pjrt
