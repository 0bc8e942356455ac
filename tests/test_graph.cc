// The graph layer of deferred-and-fused mode: canonicalisation (CSE, DCE, no-op removal,
// order-independent numbering), the structural fingerprint (the graph cache key), and the
// partition into fused elementwise groups, whose programs must reproduce eager bit for bit.
#include <algorithm>
#include <cstring>

#include "devices/cpu/kernels/fused_elementwise.h"
#include "exec/host.h"
#include "exec/ops.h"
#include "graph/fusion.h"
#include "graph/passes.h"
#include "test_util.h"

namespace kiln {
namespace {

using Kind = LaunchGroup::Kind;

// Records a graph by hand the way the recorder will: inputs and nodes with their metadata.
struct Rec {
  Graph g;
  // Inputs must all be declared before the first node, since value ids of nodes follow inputs.
  int input(const Shape& shape, DType dtype = DType::f32, Strides strides = {}) {
    EXPECT_TRUE(g.nodes.empty());
    if (strides.empty()) strides = contiguous_strides(shape);
    g.inputs.push_back({shape, dtype, strides});
    return int(g.inputs.size()) - 1;
  }
  int op(const std::string& name, std::vector<int> args, const Shape& shape, DType dtype = DType::f32,
         Attrs attrs = {}) {
    g.nodes.push_back({name, std::move(attrs), std::move(args), shape, dtype});
    return g.num_values() - 1;
  }
  void out(int v) { g.outputs.push_back(v); }
};

TEST(GraphCanonicalize, CseMergesDuplicates) {
  Rec r;
  const int x = r.input({4});
  const int e1 = r.op("exp", {x}, {4});
  const int e2 = r.op("exp", {x}, {4});
  const int c1 = r.op("clamp", {x}, {4}, DType::f32, Attrs{{"max", 1.0}});
  const int c2 = r.op("clamp", {x}, {4}, DType::f32, Attrs{{"max", 2.0}});  // other attrs: distinct
  const int s = r.op("add", {e1, e2}, {4});
  const int t = r.op("add", {c1, c2}, {4});
  r.out(s);
  r.out(e2);
  r.out(t);
  r.out(e1);
  CanonicalMap map;
  const Graph c = canonicalize(r.g, &map);
  ASSERT_EQ(c.nodes.size(), 5u) << describe(c);  // exp, add, clamp, clamp, add
  EXPECT_EQ(c.nodes[0].op, "exp");
  EXPECT_EQ(c.nodes[1].op, "add");
  EXPECT_EQ(c.nodes[1].args, (std::vector<int>{1, 1}));
  // The two exps are one output; the caller finds each original output through output_index.
  EXPECT_EQ(c.outputs, (std::vector<int>{2, 1, 5}));
  EXPECT_EQ(map.output_index, (std::vector<int>{0, 1, 2, 1}));
  EXPECT_EQ(map.value_map[size_t(e1)], map.value_map[size_t(e2)]);
}

TEST(GraphCanonicalize, DceDropsDeadNodesUnusedInputsAndIdentityCasts) {
  Rec r;
  const int unused = r.input({3});
  const int x = r.input({3});
  const int dead = r.op("exp", {unused}, {3});
  const int same = r.op("cast", {x}, {3}, DType::f32, Attrs{{"dtype", int64_t(DType::f32)}});
  const int y = r.op("neg", {same}, {3});
  r.op("sin", {dead}, {3});  // dead too
  const int bf = r.op("cast", {x}, {3}, DType::bf16, Attrs{{"dtype", int64_t(DType::bf16)}});
  const int ident = r.op("cast", {x}, {3}, DType::f32, Attrs{{"dtype", int64_t(DType::f32)}});
  r.out(y);
  r.out(bf);
  r.out(ident);
  CanonicalMap map;
  const Graph c = canonicalize(r.g, &map);
  ASSERT_EQ(c.inputs.size(), 1u) << describe(c);
  EXPECT_EQ(map.input_order, (std::vector<int>{x}));
  ASSERT_EQ(c.nodes.size(), 2u) << describe(c);
  EXPECT_EQ(c.nodes[0].op, "neg");
  EXPECT_EQ(c.nodes[0].args, (std::vector<int>{0}));  // the identity cast is gone
  EXPECT_EQ(c.nodes[1].op, "cast");                   // a real cast stays
  EXPECT_EQ(c.outputs, (std::vector<int>{1, 2, 0}));  // an identity-cast output is the input itself
  EXPECT_EQ(map.value_map[size_t(dead)], -1);
}

// The same computation recorded twice, with inputs and independent nodes stored in a different
// order (as happens when tensors are created in another order), must give one cache entry.
Graph modulation_recording(bool swapped, std::vector<int>* original_inputs) {
  Rec r;
  int x, scale, shift, one;
  if (!swapped) {
    x = r.input({2, 16, 8});
    scale = r.input({2, 1, 8});
    shift = r.input({2, 1, 8});
    one = r.input({});
  } else {
    one = r.input({});
    shift = r.input({2, 1, 8});
    x = r.input({2, 16, 8});
    scale = r.input({2, 1, 8});
  }
  *original_inputs = {x, scale, shift, one};
  int ln, a;
  if (!swapped) {
    ln = r.op("layer_norm", {x}, {2, 16, 8}, DType::f32, Attrs{{"eps", 1e-6}});
    a = r.op("add", {one, scale}, {2, 1, 8});
  } else {
    a = r.op("add", {one, scale}, {2, 1, 8});
    r.op("exp", {shift}, {2, 1, 8});  // dead, only in this recording
    ln = r.op("layer_norm", {x}, {2, 16, 8}, DType::f32, Attrs{{"eps", 1e-6}});
  }
  const int m = r.op("mul", {ln, a}, {2, 16, 8});
  r.out(r.op("add", {m, shift}, {2, 16, 8}));
  return r.g;
}

TEST(GraphCanonicalize, RecordingOrderDoesNotMatter) {
  std::vector<int> ia, ib, order_a, order_b;
  const Graph a = modulation_recording(false, &ia), b = modulation_recording(true, &ib);
  EXPECT_NE(describe(a), describe(b));
  const Graph ca = canonicalize(a, &order_a), cb = canonicalize(b, &order_b);
  EXPECT_EQ(describe(ca), describe(cb));
  EXPECT_EQ(fingerprint(ca), fingerprint(cb));
  EXPECT_NE(fingerprint(a), fingerprint(b));  // which is why the key is taken after canonicalize
  // Inputs by first use: x (layer_norm), then 1, scale, shift. The maps say where each came from.
  ASSERT_EQ(order_a.size(), 4u);
  ASSERT_EQ(order_b.size(), 4u);
  const std::vector<int> want = {0, 3, 1, 2};  // indices into {x, scale, shift, one}
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(order_a[i], ia[size_t(want[i])]);
    EXPECT_EQ(order_b[i], ib[size_t(want[i])]);
  }
  // Canonicalising is idempotent.
  EXPECT_EQ(describe(canonicalize(ca)), describe(ca));
}

TEST(GraphCanonicalize, RejectsCyclesAndBadIds) {
  Rec r;
  const int x = r.input({2});
  r.op("neg", {x + 2}, {2});
  r.op("neg", {x + 1}, {2});
  r.out(x + 1);
  EXPECT_THROW(canonicalize(r.g), Error);
  r.g.outputs = {7};
  EXPECT_THROW(canonicalize(r.g), Error);
}

// y = clamp(x * s, max=hi) -> cast(dtype_out), with a 0-d scalar input s.
Graph scalar_graph(const Shape& shape, DType dtype, const Strides& strides, AttrValue hi) {
  Rec r;
  const int x = r.input(shape, dtype, strides);
  const int s = r.input({}, DType::f32);
  const DType t = dtype;  // a 0-d f32 operand does not widen a float tensor
  const int m = r.op("mul", {x, s}, shape, t);
  Attrs attrs;
  attrs.set("max", hi);
  r.out(r.op("clamp", {m}, shape, t, attrs));
  return canonicalize(r.g);
}

TEST(GraphFingerprint, StructureAndMetadataOnly) {
  const uint64_t base = fingerprint(scalar_graph({4, 6}, DType::f32, {6, 1}, 6.0));
  // The scalar's value (dt, sigma, guidance...) lives in a 0-d input buffer, never in the graph,
  // so every denoising step builds this same graph; recomputing the key is stable.
  EXPECT_EQ(fingerprint(scalar_graph({4, 6}, DType::f32, {6, 1}, 6.0)), base);
  EXPECT_NE(fingerprint(scalar_graph({4, 7}, DType::f32, {7, 1}, 6.0)), base);      // shape
  EXPECT_NE(fingerprint(scalar_graph({4, 6}, DType::bf16, {6, 1}, 6.0)), base);     // dtype
  EXPECT_NE(fingerprint(scalar_graph({4, 6}, DType::f32, {1, 4}, 6.0)), base);      // strides (a transpose view)
  EXPECT_NE(fingerprint(scalar_graph({4, 6}, DType::f32, {0, 1}, 6.0)), base);      // strides (broadcast)
  EXPECT_NE(fingerprint(scalar_graph({4, 6}, DType::f32, {6, 1}, 6.5)), base);      // attr value
  EXPECT_NE(fingerprint(scalar_graph({4, 6}, DType::f32, {6, 1}, int64_t(6))), base);  // attr type
  // Which values are live is part of the key.
  Graph g = scalar_graph({4, 6}, DType::f32, {6, 1}, 6.0);
  g.outputs.push_back(2);
  EXPECT_NE(fingerprint(g), base);
  // So is the device: one device's executables are never another's.
  Graph elsewhere = scalar_graph({4, 6}, DType::f32, {6, 1}, 6.0);
  elsewhere.device = Device::parse("cuda:0");
  EXPECT_NE(fingerprint(elsewhere), base);
  EXPECT_FALSE(same_structure(elsewhere, scalar_graph({4, 6}, DType::f32, {6, 1}, 6.0)));
  EXPECT_EQ(canonicalize(elsewhere).device, Device::parse("cuda:0"));
  // A persistent-cache key must not change between builds or hosts: pinned (a deliberate format
  // change bumps kGraphFormatVersion and this value).
  EXPECT_EQ(base, 0xb1ba77061cf3f19dull) << std::hex << base;
}

TEST(GraphFusion, FluxModulation) {
  std::vector<int> inputs;
  const Graph g = canonicalize(modulation_recording(false, &inputs));
  // LayerNorm and its modulation are one launch: the norm is the producer of an in-place
  // elementwise epilogue (norm(x) * (1 + scale) + shift).
  const auto groups = partition(g);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].kind, Kind::epilogue);
  EXPECT_EQ(g.nodes[size_t(groups[0].chain.at(0))].op, "layer_norm");
  EXPECT_EQ(g.nodes[size_t(groups[0].chain.at(0))].args, (std::vector<int>{0}));
  EXPECT_EQ(groups[0].nodes.size(), 3u);  // 1 + scale, * ln, + shift
  EXPECT_EQ(groups[0].result, g.outputs[0]);
  EXPECT_EQ(groups[0].group_inputs.size(), 4u);  // ln (read in place), 1, scale, shift
  EXPECT_NO_THROW(validate_fused_program(groups[0].program, groups[0].group_inputs.size()));
  // Without the epilogue rule the norm would be its own launch: a norm result that is also a
  // live output stays separate.
  Graph g2 = g;
  g2.outputs.push_back(g2.value_of_node(groups[0].chain.at(0)));
  const auto groups2 = partition(canonicalize(g2));
  ASSERT_EQ(groups2.size(), 2u);
  EXPECT_EQ(groups2[0].kind, Kind::single_op);
  EXPECT_EQ(groups2[1].kind, Kind::fused_elementwise);
}

TEST(GraphFusion, LongChainIsOneGroup) {
  Rec r;
  const int x = r.input({64, 33});
  const int a = r.input({}), b = r.input({33});
  int v = x;
  const char* ops[] = {"mul", "add", "silu", "sub", "tanh"};
  for (int i = 0; i < 30; ++i) {
    const std::string op = ops[i % 5];
    v = op == "silu" || op == "tanh" ? r.op(op, {v}, {64, 33}) : r.op(op, {v, i % 2 ? a : b}, {64, 33});
  }
  r.out(v);
  const Graph g = canonicalize(r.g);
  const auto groups = partition(g);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].nodes.size(), 30u);
  EXPECT_EQ(groups[0].group_inputs.size(), 3u);
}

TEST(GraphFusion, SharedValueEndsItsGroup) {
  Rec r;
  const int x = r.input({4, 8}), s = r.input({}), w1 = r.input({8, 8}), w2 = r.input({8, 8});
  const int m = r.op("mul", {x, s}, {4, 8});
  const int y = r.op("silu", {m}, {4, 8});
  const int p = r.op("matmul", {y, w1}, {4, 8});
  const int q = r.op("matmul", {y, w2}, {4, 8});
  const int e = r.op("exp", {x}, {4, 8});  // a live output also read by a fusable node
  const int f = r.op("neg", {e}, {4, 8});
  r.out(p);
  r.out(q);
  r.out(e);
  r.out(f);
  CanonicalMap map;
  const Graph g = canonicalize(r.g, &map);
  const auto groups = partition(g);
  ASSERT_EQ(groups.size(), 5u);
  int fused = 0;
  std::vector<int> covered(g.nodes.size(), 0);
  for (const auto& grp : groups) {
    fused += grp.kind == Kind::fused_elementwise;
    for (int n : grp.nodes) ++covered[size_t(n)];
    for (int v : grp.group_inputs)  // only inputs or results of groups that run earlier
      EXPECT_TRUE(g.is_input(v) || std::any_of(groups.begin(), groups.end(), [&](const LaunchGroup& o) {
                    return o.result == v && o.result < grp.result;
                  }));
  }
  EXPECT_EQ(fused, 3);  // {mul, silu}, {exp}, {neg}
  EXPECT_EQ(covered, std::vector<int>(g.nodes.size(), 1));
  const int yc = map.value_map[size_t(y)];
  auto silu_group = std::find_if(groups.begin(), groups.end(), [&](const LaunchGroup& o) { return o.result == yc; });
  ASSERT_NE(silu_group, groups.end());
  EXPECT_EQ(silu_group->nodes.size(), 2u);
}

TEST(GraphFusion, LimitsSplitGroups) {
  // A sum of 30 distinct inputs: one group would need 30 kernel arguments.
  Rec r;
  std::vector<int> ins;
  for (int i = 0; i < 30; ++i) ins.push_back(r.input({16}));
  int v = ins[0];
  for (int i = 1; i < 30; ++i) v = r.op("add", {v, ins[size_t(i)]}, {16});
  r.out(v);
  const Graph g = canonicalize(r.g);
  const auto groups = partition(g);
  EXPECT_GT(groups.size(), 1u);
  size_t nodes = 0;
  for (const auto& grp : groups) {
    EXPECT_LE(grp.group_inputs.size(), 24u);
    nodes += grp.nodes.size();
  }
  EXPECT_EQ(nodes, 29u);
  EXPECT_EQ(partition(g, FusionLimits{.max_inputs = 30}).size(), 1u);

  // Nesting depth: a balanced tree of adds, 5 join levels, under a depth limit of 3.
  Rec t;
  std::vector<int> leaves;
  for (int i = 0; i < 32; ++i) leaves.push_back(t.input({}));
  std::vector<int> level;
  for (int i = 0; i < 32; ++i) level.push_back(t.op("exp", {leaves[size_t(i)]}, {}));
  while (level.size() > 1) {
    std::vector<int> next;
    for (size_t i = 0; i < level.size(); i += 2) next.push_back(t.op("add", {level[i], level[i + 1]}, {}));
    level = next;
  }
  t.out(level[0]);
  const Graph tg = canonicalize(t.g);
  const auto deep = partition(tg, FusionLimits{.max_inputs = 64, .max_depth = 3});
  EXPECT_GT(deep.size(), 1u);
  EXPECT_EQ(partition(tg, FusionLimits{.max_inputs = 64, .max_depth = 11, .max_nodes = 100}).size(), 1u);
}

TEST(GraphFusion, SmallerMembersAreBroadcastIntoTheGroup) {
  // exp on [4,1] is recomputed per output element of the [4,8] product rather than materialised.
  Rec r;
  const int x = r.input({4, 1}), y = r.input({4, 8});
  const int e = r.op("exp", {x}, {4, 1});
  r.out(r.op("mul", {e, y}, {4, 8}));
  const auto groups = partition(canonicalize(r.g));
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].nodes.size(), 2u);
}

// A partition's program against eager, byte for byte: broadcasting, a bf16 scalar product, a
// cast to bf16 and bf16 unary ops inside the group, an f32 result.
TEST(GraphFusion, FusedProgramMatchesEagerBytes) {
  const Tensor x = test::random_tensor({37, 53}, 1);
  const Tensor b = test::random_tensor({53}, 2, DType::bf16);
  const Tensor s = scalar(0.75);
  const Tensor t = mul(b, s);                       // bf16 [53]
  const Tensor u = add(x, t);                       // f32 [37,53]
  const Tensor v = cast(u, DType::bf16);            // bf16
  const Tensor w = silu(v);                         // bf16
  const Tensor c = clamp(w, -0.25, 1.5);            // bf16
  const Tensor z = mul(c, x);                       // f32 [37,53]
  ASSERT_EQ(t.dtype(), DType::bf16);
  ASSERT_EQ(w.dtype(), DType::bf16);
  ASSERT_EQ(z.dtype(), DType::f32);

  // Record it with inputs in an arbitrary order (s, x, b), metadata taken from the eager results.
  Rec r;
  const std::vector<Tensor> tensors = {s, x, b};
  for (const Tensor& in : tensors) r.input(in.shape(), in.dtype(), in.strides());
  auto meta = [&](const std::string& op, std::vector<int> args, const Tensor& like, Attrs attrs = {}) {
    return r.op(op, std::move(args), like.shape(), like.dtype(), std::move(attrs));
  };
  const int nt = meta("mul", {2, 0}, t);
  const int nu = meta("add", {1, nt}, u);
  const int nv = meta("cast", {nu}, v, Attrs{{"dtype", int64_t(DType::bf16)}});
  const int nw = meta("silu", {nv}, w);
  const int nc = meta("clamp", {nw}, c, Attrs{{"min", -0.25}, {"max", 1.5}});
  r.out(meta("mul", {nc, 1}, z));

  std::vector<int> order;
  const Graph g = canonicalize(r.g, &order);
  const auto groups = partition(g);
  ASSERT_EQ(groups.size(), 1u);
  const LaunchGroup& grp = groups[0];
  ASSERT_EQ(grp.kind, Kind::fused_elementwise);
  EXPECT_EQ(grp.nodes.size(), 6u);
  // One round per bf16 op output (b*s, cast, silu, clamp): eager's storage rounding.
  EXPECT_EQ(std::count_if(grp.program.instrs.begin(), grp.program.instrs.end(),
                          [](const FusedInstr& i) { return i.kind == FusedInstr::Kind::round; }),
            4);

  std::vector<TensorView> views;
  for (int v_id : grp.group_inputs) {
    ASSERT_TRUE(g.is_input(v_id));
    const Tensor& in = tensors[size_t(order[size_t(v_id)])];
    wait(in);
    views.push_back(TensorView::of(in));
  }
  Tensor out = full(g.shape_of(grp.result), 7, g.dtype_of(grp.result));  // sentinel fill
  wait(out);
  wait(z);
  cpu::fused_elementwise(grp.program, views, TensorView::of(out));
  ASSERT_EQ(out.shape(), z.shape());
  ASSERT_EQ(out.dtype(), z.dtype());
  EXPECT_EQ(std::memcmp(out.data_ptr(), z.data_ptr(), size_t(z.numel()) * dtype_size(z.dtype())), 0)
      << grp.program.describe();
}

}  // namespace
}  // namespace kiln
