// Execution mode of eager code (runtime.md §2.1). The process-wide default comes from the
// environment, read once at first use (KILN_LAUNCH_BLOCKING=1 selects the debug mode;
// changing the variable later has no effect). A scoped guard overrides the mode for the
// current thread only and restores it on exit, exceptions included.
#pragma once

namespace kiln {

enum class EagerMode {
  DeferNever,                  // strict eager: each op is enqueued at once, asynchronously
  DeferNeverAndLaunchBlocking  // debug: every op waits for its kernel, so faults name the op
};

EagerMode eager_mode();                // the calling thread's current mode
void set_default_eager_mode(EagerMode mode);  // process-wide default
const char* eager_mode_name(EagerMode mode);

class EagerModeGuard {
 public:
  explicit EagerModeGuard(EagerMode mode);
  ~EagerModeGuard();
  EagerModeGuard(const EagerModeGuard&) = delete;
  EagerModeGuard& operator=(const EagerModeGuard&) = delete;

 private:
  bool had_override_;
  EagerMode previous_;
};

}  // namespace kiln
