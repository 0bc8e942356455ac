#include "devices/cpu/kernels/onednn.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL::onednn {

dnnl::engine& engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(engine());
  return stream;
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

void add_scratchpad(Args& args, const dnnl::memory::desc& scratchpad) {
  if (scratchpad.get_size() > 0) args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(scratchpad, engine()));
}

dnnl::memory::data_type data_type(DType t) {
  return t == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

bool cpu_has(dnnl::cpu_isa isa) {
  const auto have = static_cast<unsigned>(dnnl::get_effective_cpu_isa()), want = static_cast<unsigned>(isa);
  return (have & want) == want;
}

bool bf16_dot_products_fast() {
  static const bool fast = cpu_has(dnnl::cpu_isa::avx512_core_amx) ||
                           (cpu_has(dnnl::cpu_isa::avx512_core_bf16) && __builtin_cpu_is("amd"));
  return fast;
}

bool bf16_primitives_available() {
  static const bool available = cpu_has(dnnl::cpu_isa::avx512_core);
  return available;
}

}  // namespace kiln::cpu::KILN_CPU_LEVEL::onednn
