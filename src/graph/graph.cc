#include "graph/graph.h"

#include <sstream>

#include "core/error.h"

namespace kiln {

const Shape& Graph::shape_of(int v) const {
  return is_input(v) ? inputs[size_t(v)].shape : nodes[size_t(node_of(v))].shape;
}

DType Graph::dtype_of(int v) const {
  return is_input(v) ? inputs[size_t(v)].dtype : nodes[size_t(node_of(v))].dtype;
}

void validate(const Graph& g) {
  const int nv = g.num_values();
  for (size_t i = 0; i < g.inputs.size(); ++i)
    KILN_CHECK(g.inputs[i].strides.size() == g.inputs[i].shape.size(), "graph", "input ", i, " has rank ",
               g.inputs[i].shape.size(), " but ", g.inputs[i].strides.size(), " strides");
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const int self = g.value_of_node(int(n));
    for (int a : g.nodes[n].args) {
      KILN_CHECK(a >= 0 && a < nv, "graph", "node ", n, " (", g.nodes[n].op, ") reads value ", a, " of ", nv);
      KILN_CHECK(a != self, "graph", "node ", n, " (", g.nodes[n].op, ") reads itself");
    }
  }
  for (int o : g.outputs) KILN_CHECK(o >= 0 && o < nv, "graph", "output value ", o, " of ", nv);
}

std::string describe(const Graph& g) {
  std::ostringstream os;
  for (size_t i = 0; i < g.inputs.size(); ++i)
    os << "%" << i << " = input " << dtype_name(g.inputs[i].dtype) << to_string(g.inputs[i].shape)
       << " strides " << to_string(g.inputs[i].strides) << "\n";
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const GraphNode& node = g.nodes[n];
    os << "%" << g.value_of_node(int(n)) << " = " << node.op << "(";
    for (size_t a = 0; a < node.args.size(); ++a) os << (a ? ", %" : "%") << node.args[a];
    os << ")";
    if (!node.attrs.items().empty()) os << " {" << node.attrs.str() << "}";
    os << " -> " << dtype_name(node.dtype) << to_string(node.shape) << "\n";
  }
  os << "outputs:";
  for (int o : g.outputs) os << " %" << o;
  os << "\n";
  return os.str();
}

}  // namespace kiln
