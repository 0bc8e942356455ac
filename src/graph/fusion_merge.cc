#include "graph/fusion_merge.h"

#include <algorithm>
#include <map>

namespace kiln {

bool is_row_local_view(const GraphNode& v, const Shape& shape) {
  if (v.op != "view" || v.shape != shape || shape.empty()) return false;
  const std::vector<int64_t>& st = v.attrs.get_ints("strides");
  const Strides cs = contiguous_strides(shape);
  const size_t last = shape.size() - 1;
  for (size_t d = 0; d < last; ++d)
    if (shape[d] != 1 && st[d] != cs[d]) return false;
  const int64_t off = v.attrs.get_int("offset"), n = shape[last];
  if (n == 1 || (st[last] == 1 && off == 0)) return off == 0;
  return st[last] == -1 && off == n - 1 && n <= 64;  // reversed; short, so a row never spans two tiles
}

namespace {

using Kind = LaunchGroup::Kind;

bool is_row_op(const GraphNode& n) {
  // Ops that transform each row of the last dim independently, reading the whole row before
  // writing it, so they can rewrite a buffer in place.
  if (n.op == "rms_norm" || n.op == "layer_norm") return true;
  if (n.op == "softmax") {
    const int64_t axis = n.attrs.get_int("axis", -1);
    return axis == -1 || axis == int64_t(n.shape.size()) - 1;
  }
  return false;
}

// A view node whose elements are one dense block of its base (any offset).
bool is_dense_view(const GraphNode& v) {
  return v.op == "view" && v.attrs.get_ints("strides") == canonical_unit_strides(v.shape, contiguous_strides(v.shape));
}

// A view node that only reinterprets a dense value with another shape (same element count).
bool is_plain_reshape(const Graph& g, const GraphNode& v) {
  return is_dense_view(v) && v.attrs.get_int("offset") == 0 && numel(g.shape_of(v.args.at(0))) == numel(v.shape);
}

class Merger {
 public:
  Merger(const Graph& g, std::vector<LaunchGroup>& groups, const std::vector<std::vector<int>>& consumers,
         const std::vector<char>& is_out, bool whole_row_tiles)
      : g_(g), groups_(groups), consumers_(consumers), is_out_(is_out), whole_row_tiles_(whole_row_tiles) {}

  void run() {
    alias_adjacent_views();
    absorb_row_ops();
    absorb_elementwise_epilogues();
    write_transposed();
    eliminate_concats();
    if (whole_row_tiles_) absorb_row_local_consumers();  // reads rows it rewrites: whole-row tiles only
    group_row_linears();
  }

 private:
  // Group index producing each value (as its result), -1 otherwise. Rebuilt after each pass.
  std::vector<int> by_result() const {
    std::vector<int> r(size_t(g_.num_values()), -1);
    for (size_t i = 0; i < groups_.size(); ++i) r[size_t(groups_[i].result)] = int(i);
    return r;
  }
  void drop(const std::vector<char>& dead) {
    std::vector<LaunchGroup> kept;
    for (size_t i = 0; i < groups_.size(); ++i)
      if (!dead[i]) kept.push_back(std::move(groups_[i]));
    groups_ = std::move(kept);
  }
  const std::vector<int>& consumers(int v) const { return consumers_[size_t(v)]; }
  // The group holding each node: -1 none, -2 several (a small value recomputed in each of its
  // readers' groups, graph/fusion.cc), so "all readers are in group G" is never true of a value
  // whose reader is also computed elsewhere.
  std::vector<int> group_of_nodes() const {
    std::vector<int> of(g_.nodes.size(), -1);
    for (size_t i = 0; i < groups_.size(); ++i)
      for (int n : groups_[i].nodes) of[size_t(n)] = of[size_t(n)] == -1 ? int(i) : -2;
    return of;
  }
  bool only_consumer(int v, int node) const { return consumers(v).size() == 1 && consumers(v)[0] == node; }
  // A single-op producer that can take more work in its launch, or a chain without a program.
  bool extendable(const LaunchGroup& p) const {
    if (p.into >= 0) return false;
    if (p.kind == Kind::single_op) return can_take_epilogue(g_.nodes[size_t(g_.node_of(p.result))].op);
    return p.kind == Kind::epilogue && p.program.instrs.empty();
  }
  // Turns p (single op or chain) into the chain of `into` and returns it.
  LaunchGroup as_chain(const LaunchGroup& p) const {
    LaunchGroup c;
    c.kind = Kind::epilogue;
    if (p.kind == Kind::single_op) {
      c.chain = {g_.node_of(p.result)};
      c.internal = {p.result};
    } else {
      c.chain = p.chain;
      c.internal = p.internal;
    }
    return c;
  }

  // concat(view(b), view(b), ...) of consecutive dense blocks covering b, whose dims before the
  // axis are 1: the concat is b's bytes (a single-stream block re-joining the two slices of the
  // previous block's output).
  void alias_adjacent_views() {
    for (LaunchGroup& grp : groups_) {
      if (grp.kind != Kind::single_op) continue;
      const GraphNode& c = g_.nodes[size_t(g_.node_of(grp.result))];
      if (c.op != "concat" || !dense_slices(c)) continue;
      int base = -1;
      int64_t next = 0;
      bool ok = true;
      for (int a : c.args) {
        const int an = g_.node_of(a);
        if (an < 0 || !is_dense_view(g_.nodes[size_t(an)])) {
          ok = false;
          break;
        }
        const GraphNode& v = g_.nodes[size_t(an)];
        const int b = v.args.at(0);
        ok = (base < 0 || base == b) && v.attrs.get_int("offset") == next && g_.dtype_of(b) == c.dtype;
        if (!ok) break;
        base = b;
        next += numel(v.shape);
      }
      if (!ok || base < 0 || next != numel(g_.shape_of(base)) || g_.is_input(base)) continue;
      grp.kind = Kind::alias;
      grp.alias_base = base;
      grp.group_inputs = {base};
    }
  }

  // producer [-> plain reshape] -> row op: one chain launch.
  void absorb_row_ops() {
    for (bool changed = true; changed;) {
      changed = false;
      const std::vector<int> owner = by_result();
      std::vector<char> dead(groups_.size(), 0);
      for (size_t gi = 0; gi < groups_.size(); ++gi) {
        LaunchGroup& grp = groups_[gi];
        if (grp.kind != Kind::single_op || dead[gi]) continue;
        const int rn = g_.node_of(grp.result);
        const GraphNode& row = g_.nodes[size_t(rn)];
        if (!is_row_op(row)) continue;
        int src = row.args.at(0), reshape = -1;
        if (std::count(row.args.begin(), row.args.end(), src) != 1 || !only_consumer(src, rn)) continue;
        const int sn = g_.node_of(src);
        if (sn < 0 || is_out_[size_t(src)]) continue;
        if (is_plain_reshape(g_, g_.nodes[size_t(sn)])) {
          reshape = src;
          src = g_.nodes[size_t(sn)].args.at(0);
          if (!only_consumer(src, sn) || g_.is_input(src) || is_out_[size_t(src)]) continue;
        }
        const int pg = owner[size_t(src)];
        if (pg < 0 || dead[size_t(pg)] || !extendable(groups_[size_t(pg)])) continue;
        if (g_.dtype_of(src) != row.dtype) continue;
        LaunchGroup merged = as_chain(groups_[size_t(pg)]);
        merged.chain.push_back(rn);
        if (reshape >= 0) {
          merged.internal.push_back(reshape);
          dead[size_t(owner[size_t(reshape)])] = 1;  // the reshape's view group: its bytes are internal now
        }
        merged.internal.push_back(grp.result);
        merged.result = grp.result;
        grp = std::move(merged);
        dead[size_t(pg)] = 1;
        changed = true;
      }
      drop(dead);
    }
  }

  // A producer (or chain) read only by one fused group of its shape/dtype: the group's program
  // runs in place after it (the residual `x + gate * linear(...)`, `norm(x) * (1 + s) + t`).
  void absorb_elementwise_epilogues() {
    const std::vector<int> owner = by_result();
    std::vector<char> dead(groups_.size(), 0);
    const std::vector<int> group_of_node = group_of_nodes();
    for (size_t gi = 0; gi < groups_.size(); ++gi) {
      LaunchGroup& grp = groups_[gi];
      if (grp.kind != Kind::fused_elementwise) continue;
      const GraphNode& res = g_.nodes[size_t(g_.node_of(grp.result))];
      // The latest eligible producer: in `x + gate * linear(...)` that is the linear.
      for (auto it = grp.group_inputs.rbegin(); it != grp.group_inputs.rend(); ++it) {
        const int v = *it, pn = g_.node_of(v);
        if (pn < 0 || is_out_[size_t(v)]) continue;
        const int pg = owner[size_t(v)];
        if (pg < 0 || dead[size_t(pg)] || !extendable(groups_[size_t(pg)])) continue;
        if (g_.shape_of(v) != res.shape || g_.dtype_of(v) != res.dtype) continue;
        bool only_here = true;
        for (int c : consumers(v)) only_here = only_here && group_of_node[size_t(c)] == int(gi);
        if (!only_here) continue;
        LaunchGroup merged = as_chain(groups_[size_t(pg)]);
        merged.nodes = std::move(grp.nodes);
        merged.result = grp.result;
        merged.group_inputs = std::move(grp.group_inputs);
        merged.program = std::move(grp.program);
        grp = std::move(merged);
        dead[size_t(pg)] = 1;
        break;
      }
    }
    drop(dead);
  }

  // Ops whose kernels write any output whose last dim is contiguous (rows placed by strides).
  static bool writes_strided_rows(const std::string& op) { return op == "sdpa"; }

  // copy(view(p)) where the view permutes p's dims and is p's only reader: p's launch writes
  // straight into the copy's buffer through the inverse permutation (transposed_write_strides).
  void write_transposed() {
    const std::vector<int> owner = by_result();
    std::vector<char> dead(groups_.size(), 0);
    for (LaunchGroup& grp : groups_) {
      if (grp.kind != Kind::fused_elementwise || grp.into >= 0 || grp.nodes.size() != 1) continue;
      const GraphNode& copy = g_.nodes[size_t(grp.nodes[0])];
      if (copy.op != "copy" || is_out_[size_t(grp.result)]) continue;
      const int v = copy.args.at(0), vn = g_.node_of(v);
      if (vn < 0 || is_out_[size_t(v)] || !only_consumer(v, grp.nodes[0])) continue;
      const GraphNode& view = g_.nodes[size_t(vn)];
      const int p = view.args.empty() ? -1 : view.args[0], pn = view.op == "view" ? g_.node_of(p) : -1;
      // f32 or bf16 (what sdpa writes through strides); other dtypes go through a dense staging copy.
      if (pn < 0 || is_out_[size_t(p)] || !only_consumer(p, vn) || g_.dtype_of(p) != copy.dtype ||
          (copy.dtype != DType::f32 && copy.dtype != DType::bf16) || numel(g_.shape_of(p)) != numel(view.shape))
        continue;
      const int pg = owner[size_t(p)];
      if (pg < 0 || groups_[size_t(pg)].kind != Kind::single_op || groups_[size_t(pg)].into >= 0 ||
          !writes_strided_rows(g_.nodes[size_t(pn)].op))
        continue;
      const std::vector<int64_t> strides = transposed_write_strides(g_.shape_of(p), view);
      if (strides.empty() || strides.back() != 1) continue;
      LaunchGroup& prod = groups_[size_t(pg)];
      prod.into = grp.result;
      prod.into_offset = 0;
      prod.into_strides = strides;
      dead[size_t(owner[size_t(v)])] = 1;  // the view: nothing reads it any more
      grp.kind = Kind::assembled;
      grp.group_inputs.clear();
      grp.program = {};
    }
    drop(dead);
  }

  // For a view that permutes the dims of a dense value of shape `base` (offset 0, each dim of the
  // view one dim of base): the strides at which base's elements sit in a dense copy of the view.
  // Empty when the view is not such a permutation.
  static std::vector<int64_t> transposed_write_strides(const Shape& base, const GraphNode& view) {
    const std::vector<int64_t>& vs = view.attrs.get_ints("strides");
    if (view.attrs.get_int("offset") != 0 || view.shape.size() != base.size() || vs.size() != base.size()) return {};
    const Strides bs = contiguous_strides(base), cs = contiguous_strides(view.shape);
    std::vector<int64_t> out(base.size(), 0);
    std::vector<char> used(base.size(), 0);
    for (size_t j = 0; j < base.size(); ++j) {
      if (base[j] == 1) continue;  // any stride: never stepped along
      size_t d = 0;
      while (d < vs.size() && (used[d] || view.shape[d] != base[j] || vs[d] != bs[j])) ++d;
      if (d == vs.size()) return {};
      used[d] = 1;
      out[j] = cs[d];
    }
    if (base.back() == 1) out.back() = 1;
    return out;
  }

  // A fused group E reading a chain's value B (or a concat B assembled from chains) only through
  // row-local views, B read by nothing else: E's program becomes the epilogue of each chain, over
  // that chain's rows of E's output; B is never materialised apart from E.
  void absorb_row_local_consumers() {
    const std::vector<int> owner = by_result();
    const std::vector<int> group_of_node = group_of_nodes();
    std::vector<char> dead(groups_.size(), 0);
    for (size_t ei = 0; ei < groups_.size(); ++ei) {
      LaunchGroup& e = groups_[ei];
      if (e.kind != Kind::fused_elementwise || e.into >= 0) continue;
      const Shape& es = g_.shape_of(e.result);
      if (e.program.has_iota()) continue;  // its inputs are cut to each chain's rows; an index computation would not be
      // B: the base of the first input that is a view.
      int base = -1;
      for (int v : e.group_inputs) {
        const int vn = g_.node_of(v);
        if (vn >= 0 && g_.nodes[size_t(vn)].op == "view") {
          base = g_.nodes[size_t(vn)].args.at(0);
          break;
        }
      }
      if (base < 0 || g_.is_input(base) || is_out_[size_t(base)] || owner[size_t(base)] < 0 ||
          dead[size_t(owner[size_t(base)])] || g_.dtype_of(base) != g_.dtype_of(e.result) ||
          numel(g_.shape_of(base)) != numel(es))
        continue;
      // Every reader of B is a row-local view read only by E.
      std::vector<int> views;
      bool ok = true;
      for (int c : consumers(base)) {
        const int v = g_.value_of_node(c);
        ok = ok && is_row_local_view(g_.nodes[size_t(c)], es) && !is_out_[size_t(v)];
        for (int cc : ok ? consumers(v) : std::vector<int>{}) ok = ok && group_of_node[size_t(cc)] == int(ei);
        views.push_back(v);
      }
      if (!ok || views.empty()) continue;
      // The launches writing B's bytes: the chains a concat was assembled from, or B's own chain.
      const LaunchGroup& bg = groups_[size_t(owner[size_t(base)])];
      std::vector<int> producers;
      int axis = 0;
      if (bg.kind == Kind::assembled && g_.nodes[size_t(g_.node_of(base))].op == "concat") {
        const GraphNode& c = g_.nodes[size_t(g_.node_of(base))];
        axis = int(c.attrs.get_int("axis"));
        if (axis < 0) axis += int(c.shape.size());
        // Rows along the axis, never the last dim: the row-local views permute within it.
        if (size_t(axis) + 1 >= es.size() || !std::equal(es.begin(), es.begin() + axis + 1, c.shape.begin())) continue;
        for (size_t i = 0; i < groups_.size(); ++i)
          if (groups_[i].into == base) producers.push_back(int(i));
        if (producers.size() != c.args.size()) continue;
      } else {
        producers.push_back(owner[size_t(base)]);
      }
      for (int pi : producers) {
        const LaunchGroup& p = groups_[size_t(pi)];
        const bool chain = p.kind == Kind::epilogue && p.program.instrs.empty();
        const bool single = p.kind == Kind::single_op && can_take_epilogue(g_.nodes[size_t(g_.node_of(p.result))].op);
        ok = ok && !dead[size_t(pi)] && (chain || single) && p.into_strides.empty() && p.slice_axis < 0 &&
             (p.into == base || (p.into < 0 && p.result == base));
        // E's other inputs must exist before the chain runs (groups run in result order).
        for (int v : e.group_inputs)
          if (std::find(views.begin(), views.end(), v) == views.end()) ok = ok && v < p.result;
      }
      if (!ok) continue;
      const int64_t row = numel(es) / std::max<int64_t>(es[size_t(axis)], 1);
      for (int pi : producers) {
        LaunchGroup& p = groups_[size_t(pi)];
        LaunchGroup m = as_chain(p);
        m.result = p.result;
        m.nodes = e.nodes;
        m.group_inputs = e.group_inputs;
        m.program = e.program;
        m.internal.insert(m.internal.end(), views.begin(), views.end());
        m.into = e.result;
        m.into_offset = p.into == base ? p.into_offset : 0;
        m.slice_axis = axis;
        m.slice_begin = m.into_offset / row;
        m.slice_len = numel(g_.shape_of(p.result)) / row;
        p = std::move(m);
      }
      if (bg.kind == Kind::assembled) dead[size_t(owner[size_t(base)])] = 1;
      for (int v : views) dead[size_t(owner[size_t(v)])] = 1;
      e.kind = Kind::assembled;
      e.group_inputs.clear();
      e.program = {};
    }
    drop(dead);
  }

  // Single-row linears reading one row: one grouped launch (LaunchGroup::batch).
  void group_row_linears() {
    std::map<int, std::vector<size_t>> by_row;  // x -> its linears' groups, in result order
    for (size_t i = 0; i < groups_.size(); ++i) {
      const LaunchGroup& grp = groups_[i];
      if (grp.kind != Kind::single_op || grp.into >= 0) continue;
      const GraphNode& n = g_.nodes[size_t(g_.node_of(grp.result))];
      if (n.op != "linear" || numel(n.shape) != n.shape.back()) continue;  // one row
      by_row[n.args.at(0)].push_back(i);
    }
    for (auto& [x, members] : by_row) {
      if (members.size() < 2) continue;
      std::sort(members.begin(), members.end(),
                [&](size_t a, size_t b) { return groups_[a].result < groups_[b].result; });
      LaunchGroup& lead = groups_[members[0]];
      for (size_t m = 1; m < members.size(); ++m) {
        LaunchGroup& f = groups_[members[m]];
        // Runs at the leader's place: its weights must exist by then.
        bool ready = true;
        for (int a : g_.nodes[size_t(g_.node_of(f.result))].args) ready = ready && a < lead.result;
        if (!ready) continue;
        lead.batch.push_back(f.result);
        f.kind = Kind::batched;
      }
    }
  }

  // Every dim before the concat axis is 1: each input is one dense block of the output.
  static bool dense_slices(const GraphNode& c) {
    int64_t axis = c.attrs.get_int("axis");
    if (axis < 0) axis += int64_t(c.shape.size());
    for (int64_t d = 0; d < axis; ++d)
      if (c.shape[size_t(d)] != 1) return false;
    return true;
  }

  // The launch that produces concat input `a` (itself, or the value `a` is a plain reshape of),
  // if it can write into the concat's buffer instead of its own; -1 otherwise.
  int concat_producer(int a, int cn, const std::vector<int>& owner) const {
    if (g_.is_input(a) || is_out_[size_t(a)] || !only_consumer(a, cn)) return -1;
    const GraphNode& an = g_.nodes[size_t(g_.node_of(a))];
    if (is_plain_reshape(g_, an)) {  // heads(v): the projection writes its rows into the slice
      const int b = an.args.at(0);
      if (g_.is_input(b) || is_out_[size_t(b)] || !only_consumer(b, g_.node_of(a))) return -1;
      a = b;
    }
    const int pg = owner[size_t(a)];
    return pg >= 0 && groups_[size_t(pg)].launches() && groups_[size_t(pg)].into < 0 ? pg : -1;
  }

  void eliminate_concats() {
    const std::vector<int> owner = by_result();
    for (LaunchGroup& grp : groups_) {
      // A concat already writing into an outer concat's buffer stays a launch (its own
      // buffer is that slice; nested elimination would leave the slice unwritten).
      if (grp.kind != Kind::single_op || grp.into >= 0) continue;
      const int cn = g_.node_of(grp.result);
      const GraphNode& c = g_.nodes[size_t(cn)];
      if (c.op != "concat" || !dense_slices(c)) continue;
      std::vector<int> producers;
      for (int a : c.args) {
        const int pg = std::count(c.args.begin(), c.args.end(), a) == 1 && g_.dtype_of(a) == c.dtype
                           ? concat_producer(a, cn, owner)
                           : -1;
        if (pg < 0) break;
        producers.push_back(pg);
      }
      if (producers.size() != c.args.size()) continue;
      int64_t offset = 0;
      for (size_t i = 0; i < producers.size(); ++i) {
        LaunchGroup& p = groups_[size_t(producers[i])];
        p.into = grp.result;
        p.into_offset = offset;
        offset += numel(g_.shape_of(c.args[i]));
      }
      grp.kind = Kind::assembled;
    }
  }

  const Graph& g_;
  std::vector<LaunchGroup>& groups_;
  const std::vector<std::vector<int>>& consumers_;
  const std::vector<char>& is_out_;
  const bool whole_row_tiles_;
};

}  // namespace

void merge_launches(const Graph& g, std::vector<LaunchGroup>& groups, const std::vector<std::vector<int>>& consumers,
                    const std::vector<char>& is_out, bool whole_row_tiles) {
  Merger(g, groups, consumers, is_out, whole_row_tiles).run();
}

}  // namespace kiln
