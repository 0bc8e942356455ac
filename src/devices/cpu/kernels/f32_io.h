// Kernels compute in f32. These adapters give a kernel an f32 pointer for a dense input of
// any float dtype (the input itself when it is already f32, else a converted copy), and an
// f32 output that is rounded into the real output's dtype when the kernel is done.
#pragma once
#include <vector>

#include "core/tensor_view.h"

namespace kiln::cpu {

class F32In {
 public:
  explicit F32In(const TensorView& v) {
    if (v.dtype == DType::f32) {
      ptr_ = v.as<const float>();
    } else {
      copy_.resize(size_t(v.numel()));
      convert_to_f32(v.data, v.dtype, copy_.data(), v.numel());
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

}  // namespace kiln::cpu
