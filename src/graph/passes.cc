#include "graph/passes.h"

#include <algorithm>
#include <bit>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>

#include "core/error.h"

namespace kiln {

namespace {

// A byte sink shared by CSE keys (std::string) and the fingerprint (FNV-1a), so that "equal for
// CSE" and "equal for the cache" use one definition of a node's identity.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void byte(unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  }
};
struct Bytes {
  std::string s;
  void byte(unsigned char c) { s.push_back(char(c)); }
};

template <typename Sink>
void put_u64(Sink& k, uint64_t v) {
  for (int i = 0; i < 8; ++i) k.byte(static_cast<unsigned char>(v >> (8 * i)));  // little-endian on any host
}
template <typename Sink>
void put_i64(Sink& k, int64_t v) { put_u64(k, static_cast<uint64_t>(v)); }
template <typename Sink>
void put_str(Sink& k, const std::string& s) {
  put_u64(k, s.size());  // length prefix: "ab"+"c" must not equal "a"+"bc"
  for (char c : s) k.byte(static_cast<unsigned char>(c));
}
template <typename Sink>
void put_ints(Sink& k, const std::vector<int64_t>& v) {
  put_u64(k, v.size());
  for (int64_t x : v) put_i64(k, x);
}

template <typename Sink>
void put_attrs(Sink& k, const Attrs& attrs) {
  // Attrs are kept sorted by name, so equal sets serialise equally whatever the insertion order.
  put_u64(k, attrs.items().size());
  for (const auto& [name, value] : attrs.items()) {
    put_str(k, name);
    put_u64(k, value.index());  // int 3 and double 3.0 are different attributes
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, int64_t>) {
            put_i64(k, x);
          } else if constexpr (std::is_same_v<T, double>) {
            put_u64(k, std::bit_cast<uint64_t>(x));  // exact: no decimal round trip
          } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            put_ints(k, x);
          } else {
            put_str(k, x);
          }
        },
        value);
  }
}

// A node's identity given already-canonical arg ids.
template <typename Sink>
void put_node(Sink& k, const GraphNode& n, const std::vector<int>& args) {
  put_str(k, n.op);
  put_attrs(k, n.attrs);
  put_u64(k, args.size());
  for (int a : args) put_i64(k, a);
  // Inferred from the rest, but cheap, and it keeps a recorder bug from aliasing two graphs.
  put_ints(k, n.shape);
  put_u64(k, uint64_t(n.dtype));
}

// A cast to the dtype its argument already has computes nothing (eager copies; values are equal).
// Not for a non-dense graph input: the cast's result is a dense value (views of it are
// expressed relative to that dense layout), which the input is not.
bool is_noop(const GraphNode& n, const Graph& g, const std::vector<int>& args) {
  if (n.op != "cast" || args.size() != 1 || g.dtype_of(args[0]) != n.dtype || g.shape_of(args[0]) != n.shape)
    return false;
  if (!g.is_input(args[0])) return true;
  const GraphInput& in = g.inputs[size_t(args[0])];
  return in.strides == canonical_unit_strides(in.shape, contiguous_strides(in.shape));
}

// Reachable nodes in post-order of a depth-first walk from the outputs (args in order). The walk
// only follows edges, so the order depends on structure, not on where nodes sit in g.nodes.
// Iterative: pending graphs may hold tens of thousands of nodes.
std::vector<int> post_order(const Graph& g) {
  enum : char { unseen, open, done };
  std::vector<char> state(g.nodes.size(), unseen);
  std::vector<int> order;
  std::vector<std::pair<int, size_t>> stack;  // node, next arg to visit
  for (int out : g.outputs) {
    const int root = g.node_of(out);
    if (root < 0 || state[size_t(root)] != unseen) continue;
    stack.push_back({root, 0});
    state[size_t(root)] = open;
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      const auto& args = g.nodes[size_t(n)].args;
      if (next < args.size()) {
        const int child = g.node_of(args[next++]);
        if (child < 0) continue;
        KILN_CHECK(state[size_t(child)] != open, "graph", "cycle through node ", child, " (",
                   g.nodes[size_t(child)].op, ")");
        if (state[size_t(child)] == unseen) {
          state[size_t(child)] = open;
          stack.push_back({child, 0});
        }
      } else {
        state[size_t(n)] = done;
        order.push_back(n);
        stack.pop_back();
      }
    }
  }
  return order;
}

}  // namespace

Graph canonicalize(const Graph& g, CanonicalMap* map) {
  validate(g);
  const int nin = g.num_inputs();

  // 1. Walk the live nodes bottom-up, resolving each value to its representative (an original
  //    value id): a no-op cast to its argument's, a duplicate to the first node of its class.
  std::vector<int> rep(size_t(g.num_values()), -1);
  for (int i = 0; i < nin; ++i) rep[size_t(i)] = i;
  std::vector<int> kept;  // original node indices, in canonical order
  std::unordered_map<std::string, int> seen;
  for (int n : post_order(g)) {
    const GraphNode& node = g.nodes[size_t(n)];
    std::vector<int> args;
    for (int a : node.args) args.push_back(rep[size_t(a)]);
    const int self = g.value_of_node(n);
    if (is_noop(node, g, args)) {
      rep[size_t(self)] = args[0];
      continue;
    }
    Bytes key;
    put_node(key, node, args);
    auto [it, fresh] = seen.emplace(std::move(key.s), self);
    rep[size_t(self)] = it->second;
    if (fresh) kept.push_back(n);
  }

  // 2. Number inputs by first use (kept nodes in order, args in order; then outputs that are
  //    inputs), and nodes in walk order.
  std::vector<int> input_slot(size_t(nin), -1);
  std::vector<int> input_order;
  auto use_input = [&](int v) {
    if (v < nin && input_slot[size_t(v)] < 0) {
      input_slot[size_t(v)] = int(input_order.size());
      input_order.push_back(v);
    }
  };
  for (int n : kept)
    for (int a : g.nodes[size_t(n)].args) use_input(rep[size_t(a)]);
  for (int o : g.outputs) use_input(rep[size_t(o)]);

  const int new_nin = int(input_order.size());
  std::vector<int> canon(size_t(g.num_values()), -1);  // representative original value -> canonical id
  for (int i = 0; i < nin; ++i) canon[size_t(i)] = input_slot[size_t(i)];
  for (size_t k = 0; k < kept.size(); ++k) canon[size_t(g.value_of_node(kept[k]))] = new_nin + int(k);
  auto canon_of = [&](int v) { return rep[size_t(v)] < 0 ? -1 : canon[size_t(rep[size_t(v)])]; };

  Graph out;
  out.device = g.device;
  for (int i : input_order) out.inputs.push_back(g.inputs[size_t(i)]);
  for (int n : kept) {
    GraphNode node = g.nodes[size_t(n)];
    for (int& a : node.args) a = canon_of(a);
    out.nodes.push_back(std::move(node));
  }
  std::vector<int> output_index;
  for (int o : g.outputs) {
    const int c = canon_of(o);
    auto it = std::find(out.outputs.begin(), out.outputs.end(), c);
    output_index.push_back(int(it - out.outputs.begin()));
    if (it == out.outputs.end()) out.outputs.push_back(c);
  }

  if (map != nullptr) {
    map->input_order = input_order;
    map->output_index = std::move(output_index);
    map->value_map.assign(size_t(g.num_values()), -1);
    for (int v = 0; v < g.num_values(); ++v) map->value_map[size_t(v)] = canon_of(v);
  }
  return out;
}

Graph canonicalize(const Graph& g, std::vector<int>* input_order) {
  CanonicalMap map;
  Graph out = canonicalize(g, &map);
  if (input_order != nullptr) *input_order = std::move(map.input_order);
  return out;
}

uint64_t fingerprint(const Graph& g) {
  Fnv k;
  put_str(k, "kiln.graph");
  put_u64(k, kGraphFormatVersion);
  put_str(k, g.device.str());
  put_u64(k, g.inputs.size());
  for (const GraphInput& in : g.inputs) {
    put_ints(k, in.shape);
    put_ints(k, in.strides);  // exact strides: the fused kernel is launched per layout
    put_u64(k, uint64_t(in.dtype));
  }
  put_u64(k, g.nodes.size());
  for (const GraphNode& n : g.nodes) put_node(k, n, n.args);
  put_u64(k, g.outputs.size());
  for (int o : g.outputs) put_i64(k, o);
  return k.h;
}

bool same_structure(const Graph& a, const Graph& b) {
  if (a.device != b.device || a.inputs.size() != b.inputs.size() || a.nodes.size() != b.nodes.size() ||
      a.outputs != b.outputs)
    return false;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const GraphInput &x = a.inputs[i], &y = b.inputs[i];
    if (x.shape != y.shape || x.dtype != y.dtype || x.strides != y.strides) return false;
  }
  for (size_t n = 0; n < a.nodes.size(); ++n) {
    const GraphNode &x = a.nodes[n], &y = b.nodes[n];
    if (x.op != y.op || x.args != y.args || x.shape != y.shape || x.dtype != y.dtype ||
        x.attrs.items() != y.attrs.items())
      return false;
  }
  return true;
}

}  // namespace kiln
