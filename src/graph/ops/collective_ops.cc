// Collectives: graph ops like any other, so tensor-parallel models run
// them in strict eager, deferred and compiled modes alike. They act on this process's world
// (distributed/process_group.h); their reference is the single-rank result (identity).
#include "graph/ops/ref_util.h"

namespace kiln {

namespace {

// all_reduce: the elementwise sum of x over all ranks, computed in f32 (a bf16/f16 x is widened,
// summed and rounded once, as a reduced-precision NCCL sum of two ranks rounds once).
void register_all_reduce() {
  OpDef def;
  def.name = "all_reduce";
  def.kind = OpKind::collective;
  def.min_inputs = def.max_inputs = 1;
  def.infer = [](const std::vector<Tensor>& in, const Attrs&) {
    KILN_CHECK(is_floating(in[0].dtype()), "all_reduce", "sums floating-point tensors, got ", in[0].describe());
    return OutputMeta{in[0].shape(), in[0].dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs&, const OutputMeta&) { return in[0].data; };
  register_op(std::move(def));
}

// all_gather: every rank's x concatenated along `axis`, in rank order; `world_size` (an attr,
// so shapes are known when the op is recorded) must be the world's size.
void register_all_gather() {
  OpDef def;
  def.name = "all_gather";
  def.kind = OpKind::collective;
  def.min_inputs = def.max_inputs = 1;
  def.infer = [](const std::vector<Tensor>& in, const Attrs& attrs) {
    const Tensor& x = in[0];
    const int64_t ws = attrs.get_int("world_size");
    KILN_CHECK(ws >= 1, "all_gather", "world_size must be positive, got ", ws);
    KILN_CHECK(x.rank() >= 1, "all_gather", "needs a tensor of rank >= 1, got ", x.describe());
    const int64_t axis = attrs.get_int("axis");
    KILN_CHECK(axis >= 0 && axis < x.rank(), "all_gather", "axis ", axis, " out of range for ", x.describe());
    Shape s = x.shape();
    s[size_t(axis)] *= ws;
    return OutputMeta{s, x.dtype()};
  };
  def.reference = [](const std::vector<HostTensor>& in, const Attrs& attrs, const OutputMeta&) {
    KILN_CHECK(attrs.get_int("world_size") == 1, "all_gather", "the reference is the single-rank case");
    return in[0].data;
  };
  register_op(std::move(def));
}

}  // namespace

void register_collective_ops() {
  register_all_reduce();
  register_all_gather();
}

}  // namespace kiln
