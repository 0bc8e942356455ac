// Collective kernels: the output gets this rank's value, then the process group combines it
// with the other ranks' (distributed/process_group.h). They run on the device's queue thread,
// in queue order, so every rank issues its collectives in the same order.
#include <cstring>
#include <vector>

#include "core/error.h"

#include "devices/cpu/kernels/kernel_table.h"
#include "distributed/process_group.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

namespace {

void all_reduce_kernel(const KernelArgs& args) {
  const TensorView &x = args.in[0], &out = args.out;
  const size_t n = size_t(out.numel());
  if (x.dtype == DType::f32) {
    std::memcpy(out.data, x.data, n * sizeof(float));  // dense inputs (the dispatcher's rule)
    ProcessGroup::world()->all_reduce_sum(static_cast<float*>(out.data), n);
    return;
  }
  std::vector<float> sum(n);  // activations, not weights: summed in f32, rounded once
  convert_to_f32(x.data, x.dtype, sum.data(), int64_t(n));
  ProcessGroup::world()->all_reduce_sum(sum.data(), n);
  convert_from_f32(sum.data(), out.data, out.dtype, int64_t(n));
}

void all_gather_kernel(const KernelArgs& args) {
  const TensorView &x = args.in[0], &out = args.out;
  ProcessGroup& pg = *ProcessGroup::world();
  const int64_t ws = args.attrs->get_int("world_size"), axis = args.attrs->get_int("axis");
  KILN_CHECK(ws == pg.size(), "all_gather", "recorded for a world of ", ws, " ranks, running in ", pg.describe());
  const size_t es = dtype_size(x.dtype), piece = size_t(x.numel()) * es;
  // Rank-major [ws, x] first, then each rank's block moved to its place along `axis`.
  std::vector<char> all(piece * size_t(ws));
  pg.all_gather(x.data, all.data(), piece);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[size_t(d)];
  for (size_t d = size_t(axis); d < x.shape.size(); ++d) inner *= x.shape[d];
  const size_t run = size_t(inner) * es;  // one rank's contiguous run per outer index
  char* dst = static_cast<char*>(out.data);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < ws; ++r)
      std::memcpy(dst + (size_t(o) * size_t(ws) + size_t(r)) * run, all.data() + size_t(r) * piece + size_t(o) * run,
                  run);
}

}  // namespace

void add_collective_kernels(KernelTable& table) {
  table["all_reduce"] = &all_reduce_kernel;
  table["all_gather"] = &all_gather_kernel;
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL
