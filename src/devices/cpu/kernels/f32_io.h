// Kernels compute in f32. These adapters give a kernel an f32 pointer for a dense input of
// any float dtype (the input itself when it is already f32, else a converted copy), and an
// f32 output that is rounded into the real output's dtype when the kernel is done.
//
// A converted copy is a whole operand made again at twice the size of a bf16 one, on every
// call: the kernels that read bf16 directly (linear_gemm.h, gemv.h) never take one, and
// f32_conversion_bytes() lets tests and reports check that.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor_view.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

// The dtypes the contraction kernels read and write as they are (no F32In/F32Out copies).
inline bool f32_or_bf16(DType t) { return t == DType::f32 || t == DType::bf16; }

// Bytes of non-f32 inputs F32In has converted into f32 copies since the process started (the
// source bytes: a bf16 [N,K] weight adds 2·N·K). Monotonic, from every thread.
int64_t f32_conversion_bytes();

namespace detail {
void count_f32_conversion(int64_t bytes);
}  // namespace detail

class F32In {
 public:
  explicit F32In(const TensorView& v) {
    if (v.dtype == DType::f32) {
      ptr_ = v.as<const float>();
    } else {
      copy_.resize(size_t(v.numel()));
      convert_to_f32(v.data, v.dtype, copy_.data(), v.numel());
      detail::count_f32_conversion(int64_t(storage_bytes(v.dtype, v.numel())));
      ptr_ = copy_.data();
    }
  }
  const float* get() const { return ptr_; }

 private:
  const float* ptr_ = nullptr;
  std::vector<float> copy_;
};

class F32Out {
 public:
  explicit F32Out(const TensorView& v) : view_(v) {
    if (v.dtype == DType::f32) {
      ptr_ = v.as<float>();
    } else {
      copy_.resize(size_t(v.numel()));
      ptr_ = copy_.data();
    }
  }
  ~F32Out() {
    if (view_.dtype != DType::f32) convert_from_f32(copy_.data(), view_.data, view_.dtype, view_.numel());
  }
  F32Out(const F32Out&) = delete;
  F32Out& operator=(const F32Out&) = delete;
  float* get() const { return ptr_; }

 private:
  TensorView view_;
  float* ptr_ = nullptr;
  std::vector<float> copy_;
};

}  // namespace kiln::cpu::KILN_CPU_LEVEL
