#include "graph/op.h"

#include <map>
#include <mutex>

#include "core/error.h"

namespace kiln {

// Each op family registers itself from one function (no static-initialiser magic, which a
// static library would silently drop).
void register_elementwise_ops();
void register_reduction_ops();
void register_movement_ops();
void register_contraction_ops();
void register_collective_ops();

namespace {

std::map<std::string, OpDef>& registry() {
  static std::map<std::string, OpDef> ops;
  return ops;
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_elementwise_ops();
    register_reduction_ops();
    register_movement_ops();
    register_contraction_ops();
    register_collective_ops();
  });
}

}  // namespace

void register_op(OpDef def) {
  auto& ops = registry();
  KILN_CHECK(ops.find(def.name) == ops.end(), "ops", "op '", def.name, "' registered twice");
  std::string name = def.name;
  ops.emplace(std::move(name), std::move(def));
}

const OpDef& op_def(const std::string& name) {
  ensure_registered();
  auto it = registry().find(name);
  KILN_CHECK(it != registry().end(), "ops", "unknown op '", name, "'");
  return it->second;
}

std::vector<std::string> op_names() {
  ensure_registered();
  std::vector<std::string> names;
  for (const auto& [name, def] : registry()) names.push_back(name);
  return names;
}

HostTensor reference_run(const std::string& op, const std::vector<HostTensor>& inputs,
                         const Attrs& attrs, const OutputMeta& out) {
  const OpDef& def = op_def(op);
  KILN_CHECK(bool(def.reference), op, "has no reference implementation");
  HostTensor result{out.shape, out.dtype, def.reference(inputs, attrs, out)};
  KILN_CHECK(int64_t(result.data.size()) == result.numel(), op, "reference produced ",
             result.data.size(), " values for shape ", to_string(out.shape));
  // Round through the storage dtype so the oracle sees what a kernel can represent.
  std::vector<char> tmp(dtype_size(out.dtype));
  for (double& v : result.data) {
    store_from_double(tmp.data(), out.dtype, 0, v);
    v = load_as_double(tmp.data(), out.dtype, 0);
  }
  return result;
}

}  // namespace kiln
