#include "graph/fusion.h"

#include <algorithm>
#include <limits>
#include <queue>

#include "core/error.h"
#include "graph/fusion_merge.h"

namespace kiln {

namespace {

// Distinct values read by `members` that are not themselves members, in order of first use.
std::vector<int> reads_of(const Graph& g, const std::vector<int>& members, const std::vector<char>& in_group) {
  std::vector<int> reads;
  for (int n : members)
    for (int a : g.nodes[size_t(n)].args) {
      const int an = g.node_of(a);
      if (an >= 0 && in_group[size_t(an)]) continue;
      if (std::find(reads.begin(), reads.end(), a) == reads.end()) reads.push_back(a);
    }
  return reads;
}

FusedProgram build_program(const Graph& g, const LaunchGroup& grp) {
  FusedProgram p;
  std::vector<int> reg(size_t(g.num_values()), -1);
  auto emit = [&](FusedInstr in) {
    p.instrs.push_back(in);
    return int(p.instrs.size()) - 1;
  };
  for (size_t i = 0; i < grp.group_inputs.size(); ++i) {
    FusedInstr in;
    in.kind = FusedInstr::Kind::load;
    in.input = int(i);
    reg[size_t(grp.group_inputs[i])] = emit(in);
  }
  for (int n : grp.nodes) {
    const GraphNode& node = g.nodes[size_t(n)];
    std::vector<int> a;
    for (int v : node.args) a.push_back(reg[size_t(v)]);
    int r = -1;
    FusedInstr in;
    if (node.op == "arange") {
      in.kind = FusedInstr::Kind::iota;
      in.start = node.attrs.get_float("start");
      in.step = node.attrs.get_float("step");
      in.count = node.shape.at(0);
      r = emit(in);
    } else if (auto u = unary_from_name(node.op)) {
      in.kind = FusedInstr::Kind::unary;
      in.unary = *u;
      in.a = a.at(0);
      // Eager's clamp kernel uses float(attr), so the fused one must too.
      in.lo = float(node.attrs.get_float("min", -std::numeric_limits<double>::infinity()));
      in.hi = float(node.attrs.get_float("max", std::numeric_limits<double>::infinity()));
      r = emit(in);
    } else if (auto b = binary_from_name(node.op)) {
      in.kind = FusedInstr::Kind::binary;
      in.binary = *b;
      in.a = a.at(0);
      in.b = a.at(1);
      r = emit(in);
    } else if (node.op == "where") {
      in.kind = FusedInstr::Kind::where;
      in.a = a.at(0);
      in.b = a.at(1);
      in.c = a.at(2);
      r = emit(in);
    } else {
      // cast / copy / a leading-unit reshape: no arithmetic; a cast's effect is entirely the round
      // below (loads already widen any storage dtype to f32 exactly as eager's kernels do), and
      // such a reshape broadcasts to the result exactly as its argument does.
      r = a.at(0);
    }
    if (node.dtype != DType::f32) {
      FusedInstr rd;
      rd.kind = FusedInstr::Kind::round;
      rd.dtype = node.dtype;
      rd.a = r;
      r = emit(rd);
    }
    reg[size_t(g.value_of_node(n))] = r;
  }
  p.result = reg[size_t(grp.result)];
  validate_fused_program(p, grp.group_inputs.size());  // a fuser bug should fail here, not in a kernel
  return p;
}

}  // namespace

namespace {

Shape without_leading_ones(const Shape& s) {
  size_t i = 0;
  while (i < s.size() && s[i] == 1) ++i;
  return Shape(s.begin() + int64_t(i), s.end());
}

// A view that only adds leading unit dims to a dense value ([C] -> [1,C]): under right-aligned
// broadcasting it reads every element exactly as its argument does, and its argument, loaded in
// its own (lower-rank) shape, still broadcasts to any group result the view broadcasts to.
// (Dropping leading unit dims would give the kernel an input of higher rank than its output.)
bool is_leading_unit_reshape(const Graph& g, const GraphNode& v) {
  if (v.op != "view" || v.attrs.get_int("offset") != 0) return false;
  const Shape& base = g.shape_of(v.args.at(0));
  return v.attrs.get_ints("strides") == canonical_unit_strides(v.shape, contiguous_strides(v.shape)) &&
         v.shape.size() >= base.size() && numel(base) == numel(v.shape) &&
         without_leading_ones(base) == without_leading_ones(v.shape);
}

// Whether node n may be a member of a fused group: an elementwise op, an f32 arange (an index
// computation, FusedInstr::iota), or a leading-unit reshape (never a group's result: a view
// launches nothing).
bool is_fusable_node(const Graph& g, size_t n) {
  const GraphNode& node = g.nodes[n];
  if (node.op == "arange") return node.dtype == DType::f32;
  if (node.op == "view") return is_leading_unit_reshape(g, node);
  return is_fusable_op(node.op);
}

// Small values (timestep and guidance embeddings, per-block modulation vectors) are recomputed
// inside every group that reads them rather than materialised between launches, when those
// groups are small too (duplication never multiplies real work).
constexpr int64_t kDuplicateMaxElements = 4096;

}  // namespace

bool is_fusable_op(const std::string& op) {
  return unary_from_name(op).has_value() || binary_from_name(op).has_value() || op == "where" || op == "cast" ||
         op == "copy";
}

std::string LaunchGroup::launch_name(const Graph& g) const {
  if (kind == Kind::fused_elementwise) return "fused_elementwise";
  if (!batch.empty()) return "grouped_linear";
  if (kind != Kind::epilogue) return g.nodes[size_t(g.node_of(result))].op;
  std::string name;
  for (int n : chain) name += (name.empty() ? "" : "+") + g.nodes[size_t(n)].op;
  return program.instrs.empty() ? name : name + "+epilogue";
}

bool can_take_epilogue(const std::string& op) {
  // Ops whose kernels write every output element exactly once and never read the output, so a
  // program may then run over the output in place. (Factories, views and copies are excluded:
  // a copy is already fusable, a view has no kernel.)
  static const char* const ops[] = {"linear", "matmul", "conv2d", "layer_norm", "rms_norm", "group_norm",
                                    "softmax", "sdpa", "concat", "sum", "mean", "max", "var", "gather"};
  for (const char* o : ops)
    if (op == o) return true;
  return false;
}

std::vector<LaunchGroup> partition(const Graph& g, const FusionLimits& limits) {
  validate(g);
  const size_t nn = g.nodes.size();
  std::vector<char> fusable(nn), is_out(size_t(g.num_values()), 0);
  std::vector<std::vector<int>> consumers(size_t(g.num_values()));  // distinct consumer nodes
  std::vector<char> branches(nn, 0);  // node joins two or more distinct fusable nodes
  for (int o : g.outputs) is_out[size_t(o)] = 1;
  for (size_t n = 0; n < nn; ++n) fusable[n] = is_fusable_node(g, n);
  for (size_t n = 0; n < nn; ++n) {
    std::vector<int> fused_args;
    for (int a : g.nodes[n].args) {
      KILN_CHECK(a < g.value_of_node(int(n)), "fusion", "graph is not in topological order (node ", n,
                 " reads value ", a, "); canonicalize it first");
      auto& c = consumers[size_t(a)];
      if (c.empty() || c.back() != int(n)) c.push_back(int(n));
      const int an = g.node_of(a);
      if (an >= 0 && fusable[size_t(an)] && std::find(fused_args.begin(), fused_args.end(), an) == fused_args.end())
        fused_args.push_back(an);
    }
    branches[n] = fused_args.size() >= 2;
  }

  // A node can be recomputed in each group that reads it (see kDuplicateMaxElements) when it is
  // small, not an output, and every reader is itself fusable.
  std::vector<char> duplicable(nn, 0);
  for (size_t n = 0; n < nn; ++n) {
    const int v = g.value_of_node(int(n));
    bool ok = fusable[n] && !is_out[size_t(v)] && numel(g.nodes[n].shape) <= kDuplicateMaxElements;
    for (int c : consumers[size_t(v)]) ok = ok && fusable[size_t(c)];
    duplicable[n] = ok;
  }
  std::vector<char> read_by_a_group(size_t(g.num_values()), 0);  // some group loads it: materialise it

  std::vector<int> group_of(nn, -1);
  std::vector<LaunchGroup> groups;
  // Roots are taken from the last node down: when a node is reached unclaimed, every consumer
  // of it is already placed, so it must be materialised and roots a group, unless it was
  // recomputed inside every group that reads it.
  for (int r = int(nn) - 1; r >= 0; --r) {
    if (group_of[size_t(r)] >= 0) continue;
    if (duplicable[size_t(r)] && !read_by_a_group[size_t(g.value_of_node(r))] &&
        !consumers[size_t(g.value_of_node(r))].empty())
      continue;  // computed inside each of its readers' groups
    const int gid = int(groups.size());
    LaunchGroup grp;
    grp.result = g.value_of_node(r);
    group_of[size_t(r)] = gid;
    if (!fusable[size_t(r)] || g.nodes[size_t(r)].op == "view") {
      grp.kind = g.nodes[size_t(r)].op == "view" ? LaunchGroup::Kind::view : LaunchGroup::Kind::single_op;
      grp.nodes = {r};
      grp.group_inputs = g.nodes[size_t(r)].args;
      for (int v : grp.group_inputs) read_by_a_group[size_t(v)] = 1;
      groups.push_back(std::move(grp));
      continue;
    }
    grp.kind = LaunchGroup::Kind::fused_elementwise;
    const Shape& out_shape = g.nodes[size_t(r)].shape;
    std::vector<int> members = {r};
    std::vector<char> in_group(nn, 0);
    in_group[size_t(r)] = 1;
    std::vector<int> level(nn, 0);
    level[size_t(r)] = 1;
    std::vector<char> queued(nn, 0);
    std::vector<char> copy_here(nn, 0);  // joined as a recomputed copy (other groups may hold it too)
    const bool small_group = numel(out_shape) <= kDuplicateMaxElements;
    // Candidates in descending order: when p is popped, every node that will ever join with a
    // higher index (so every possible in-group consumer of p) has already joined, so "all
    // consumers inside" is decided exactly, once.
    std::priority_queue<int> cand;
    auto offer_args = [&](int n) {
      for (int a : g.nodes[size_t(n)].args) {
        const int an = g.node_of(a);
        if (an >= 0 && fusable[size_t(an)] && !queued[size_t(an)]) {
          queued[size_t(an)] = 1;
          cand.push(an);
        }
      }
    };
    offer_args(r);
    while (!cand.empty()) {
      const int p = cand.top();
      cand.pop();
      if (group_of[size_t(p)] >= 0 || is_out[size_t(g.value_of_node(p))]) continue;
      if (int(members.size()) >= limits.max_nodes) continue;
      if (!broadcasts_to(g.nodes[size_t(p)].shape, out_shape)) continue;
      bool inside = true, below_copy = false;
      int lvl = 0;
      for (int c : consumers[size_t(g.value_of_node(p))]) {
        if (in_group[size_t(c)]) {
          lvl = std::max(lvl, level[size_t(c)] + branches[size_t(c)]);
          below_copy = below_copy || copy_here[size_t(c)];
        } else {
          inside = false;
        }
      }
      // Read from outside the group, or by a node other groups recompute too: p can only join
      // as a recomputed copy.
      const bool as_copy = !inside || below_copy;
      if ((as_copy && !(duplicable[size_t(p)] && small_group)) || lvl > limits.max_depth) continue;
      in_group[size_t(p)] = 1;
      members.push_back(p);
      if (int(reads_of(g, members, in_group).size()) > limits.max_inputs) {
        in_group[size_t(p)] = 0;  // too many kernel arguments: p stays a materialised input
        members.pop_back();
        continue;
      }
      level[size_t(p)] = lvl;
      if (as_copy) {
        copy_here[size_t(p)] = 1;
      } else {
        group_of[size_t(p)] = gid;
      }
      offer_args(p);
    }
    std::sort(members.begin(), members.end());
    grp.group_inputs = reads_of(g, members, in_group);
    for (int v : grp.group_inputs) read_by_a_group[size_t(v)] = 1;
    grp.nodes = std::move(members);
    grp.program = build_program(g, grp);
    groups.push_back(std::move(grp));
  }
  merge_launches(g, groups, consumers, is_out, limits.whole_row_tiles);
  // A group reads only results of nodes below its own result, so ascending results is a valid
  // execution order (an epilogue's producer is below its group's result too).
  std::sort(groups.begin(), groups.end(), [](const LaunchGroup& a, const LaunchGroup& b) { return a.result < b.result; });
  return groups;
}

}  // namespace kiln
