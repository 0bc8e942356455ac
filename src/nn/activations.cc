#include "nn/activations.h"

#include "core/error.h"
#include "exec/ops.h"

namespace kiln::nn {

bool is_known_activation(const std::string& name) {
  return name == "quick_gelu" || name == "gelu" || name == "gelu_new" || name == "gelu_pytorch_tanh" ||
         name == "relu" || name == "silu" || name == "swish";
}

Tensor activation(const std::string& name, const Tensor& x) {
  if (name == "quick_gelu") return quick_gelu(x);
  if (name == "gelu") return gelu(x, "none");
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return gelu(x, "tanh");
  if (name == "relu") return relu(x);
  if (name == "silu" || name == "swish") return silu(x);
  fail("activation", "unsupported activation '", name, "'");
}

Tensor clamp_fp16(const Tensor& x) { return x.dtype() == DType::f16 ? clamp(x, -65504.0, 65504.0) : x; }

}  // namespace kiln::nn
