#include "nn/weight_quantization.h"

#include <vector>

#include "core/error.h"
#include "core/quant_blocks.h"
#include "exec/host.h"

namespace kiln::nn {

Tensor quantize_weight(const Tensor& w, DType type) {
  KILN_CHECK(is_storage_only(type), "quantize", dtype_name(type), " is not a quantized storage type");
  KILN_CHECK(w.rank() == 2 && is_floating(w.dtype()) && w.is_contiguous(), "quantize",
             "quantizes a dense float [N,K] weight, got ", w.describe());
  const int64_t N = w.dim(0), K = w.dim(1);
  KILN_CHECK(K % dtype_block_elems(type) == 0, "quantize", dtype_name(type), " needs in_features (", K,
             ") to be a whole number of its ", dtype_block_elems(type), "-element blocks");
  wait(w);
  BufferPtr buf = host_allocate(storage_bytes(type, N * K));
  const char* src = static_cast<const char*>(w.data_ptr());
  char* dst = static_cast<char*>(buf->data());
  const size_t in_row = storage_bytes(w.dtype(), K), out_row = storage_bytes(type, K);
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      convert_to_f32(src + size_t(r) * in_row, w.dtype(), row.data(), K);
      quantize_from_f32(type, row.data(), dst + size_t(r) * out_row, K);
    }
  }
  return Tensor::view_of(std::move(buf), {N, K}, type);
}

}  // namespace kiln::nn
