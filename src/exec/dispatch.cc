#include "exec/dispatch.h"

#include <memory>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/capture.h"
#include "exec/counters.h"
#include "exec/deferred.h"
#include "exec/mode.h"
#include "exec/profile.h"
#include "graph/op.h"

namespace kiln {

namespace {

void check_inputs(const OpDef& def, const std::vector<Tensor>& inputs) {
  const int n = int(inputs.size());
  KILN_CHECK(n >= def.min_inputs && (def.max_inputs < 0 || n <= def.max_inputs), def.name, "takes ",
             def.min_inputs, (def.max_inputs == def.min_inputs ? "" : " or more"), " inputs, got ", n);
  for (int i = 0; i < n; ++i) {
    KILN_CHECK(inputs[size_t(i)].defined(), def.name, "input ", i, " is an undefined tensor");
    // A capture runs nothing: a memory trace's host placeholders may meet weights placed on an
    // accelerator (a compiled graph checks where its inputs are when it runs).
    KILN_CHECK(inputs[size_t(i)].device() == inputs[0].device() || detail::capturing(), def.name, "input ", i,
               " is on ", inputs[size_t(i)].device().str(), " but input 0 is on ", inputs[0].device().str());
    KILN_CHECK(!is_storage_only(inputs[size_t(i)].dtype()) || i == def.quantized_input, def.name, "input ", i, " is ",
               inputs[size_t(i)].describe(), ": a quantized weight is read only as a linear's weight");
  }
}

Tensor launch(const OpDef& def, std::vector<Tensor> inputs, Attrs attrs, const OutputMeta& meta,
              const Device& device) {
  DeviceRuntime& rt = runtime(device);
  const KernelFn kernel = rt.kernel(def.name);
  BufferPtr out_buf = rt.allocate(storage_bytes(meta.dtype, numel(meta.shape)));
  Tensor out = Tensor::view_of(out_buf, meta.shape, meta.dtype);
  // Profiling (exec/profile.h) reads the operands before the work takes them.
  std::vector<Tensor> operands;
  Attrs profiled_attrs;
  if (profiling()) {
    operands = inputs;
    operands.push_back(out);
    profiled_attrs = attrs;
  }
  // The queued work holds the inputs and output, so their buffers outlive the kernel even if
  // the caller drops every handle before it runs.
  std::function<void()> work = [kernel, inputs = std::move(inputs), out, attrs = std::move(attrs)] {
    KernelArgs args;
    args.in.reserve(inputs.size());
    for (const Tensor& t : inputs) args.in.push_back(TensorView::of(t));
    args.out = TensorView::of(out);
    args.attrs = &attrs;
    kernel(args);
  };
  if (!operands.empty())
    work = detail::profiled(def.name, detail::operand_bytes(operands), std::move(work), &operands, &profiled_attrs);
  const uint64_t seq = rt.enqueue(def.name, std::move(work), out_buf->bytes());
  out_buf->set_ready_seq(seq);
  detail::count_kernel(def.name);
  if (eager_mode() == EagerMode::DeferNeverAndLaunchBlocking) {
    rt.wait_for(seq);
    detail::count_sync(true);
  }
  return out;
}

}  // namespace

Tensor dispatch(const std::string& op, std::vector<Tensor> inputs, Attrs attrs, std::optional<Device> device) {
  const OpDef& def = op_def(op);
  check_inputs(def, inputs);
  const OutputMeta meta = def.infer(inputs, attrs);  // shape/dtype errors raise here, in every mode
  detail::count_op();
  // A capture (compiled mode's trace) records whatever the eager mode is.
  const bool defer = eager_mode() == EagerMode::DeferAndFuse || detail::capturing();
  if (!defer) {
    detail::flush_before_eager_op();
    for (const Tensor& t : inputs) t.buffer();  // materialised now (or a clear error), not on the worker
  }
  if (def.view) {
    const ViewMeta v = def.view(inputs[0], attrs);
    // A view of a deferred value is a deferred view of the same pending value.
    if (inputs[0].is_pending())
      return Tensor::deferred(inputs[0].pending_value(), v.shape, meta.dtype, inputs[0].device(), v.strides, v.offset);
    return Tensor::view_of(inputs[0].buffer(), v.shape, meta.dtype, v.strides, v.offset);
  }
  const Device dev = inputs.empty() ? device.value_or(default_device()) : inputs[0].device();
  std::vector<OperandMeta> metas;
  metas.reserve(inputs.size());
  for (const Tensor& t : inputs) metas.push_back({t.shape(), t.dtype()});
  runtime_for(def.name, dev, metas);
  // Kernels without strided reads get dense copies (in deferred mode: recorded copy nodes,
  // which fuse with whatever produces them).
  if (!def.strided_inputs)
    for (Tensor& t : inputs)
      if (!t.is_contiguous()) t = dispatch("copy", {t});
  if (defer) return detail::record(def, std::move(inputs), std::move(attrs), meta, dev);
  return launch(def, std::move(inputs), std::move(attrs), meta, dev);
}

}  // namespace kiln
