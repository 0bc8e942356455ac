// Watching the traces a computation makes. While a CaptureObserver is alive on a thread, every
// capture completed on it (exec/capture.h: compiled mode's traces, and the memory estimates'
// traces of each component) is handed to it with the name it was traced under. kiln plan
// collects a pipeline call's component graphs this way, to compile them for another device
// without a second copy of each pipeline's tracing code.
#pragma once
#include <functional>
#include <string>

#include "exec/capture.h"

namespace kiln {

class CaptureObserver {
 public:
  using Callback = std::function<void(const std::string& what, const detail::Captured& captured)>;
  explicit CaptureObserver(Callback callback);
  ~CaptureObserver();
  CaptureObserver(const CaptureObserver&) = delete;
  CaptureObserver& operator=(const CaptureObserver&) = delete;

  // Hands a finished capture to the thread's observers, innermost first.
  static void notify(const std::string& what, const detail::Captured& captured);

 private:
  Callback callback_;
  CaptureObserver* previous_;
};

}  // namespace kiln
