// Scratch memory for one kernel call, never initialised, from system_allocate: huge pages for
// large blocks, since faulting fresh scratch in 4 KiB pages would cost as much as the work it
// holds (a widened weight panel, packed tiles).
#pragma once
#include <cstddef>

#include "core/error.h"
#include "devices/cpu/allocator.h"
#include "devices/cpu/kernels/level.h"

namespace kiln::cpu::inline KILN_CPU_LEVEL {

class CallScratch {
 public:
  // `op` names the kernel in the out-of-memory error.
  CallScratch(const char* op, size_t bytes) {
    if (bytes == 0) return;
    p_ = system_allocate(bytes);
    if (!p_) fail(op, "out of host memory (", bytes, " bytes)");
    bytes_ = bytes;
  }
  ~CallScratch() { system_free(p_, bytes_); }
  CallScratch(const CallScratch&) = delete;
  CallScratch& operator=(const CallScratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kiln::cpu::KILN_CPU_LEVEL
