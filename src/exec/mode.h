// Execution mode of eager code. The process-wide default comes from the
// environment, read once at first use (KILN_LAUNCH_BLOCKING=1 selects the debug mode,
// KILN_DEFER_AND_FUSE=1 deferred-and-fused mode; changing the variables later has no effect). A scoped guard overrides the mode for the
// current thread only and restores it on exit, exceptions included.
#pragma once

namespace kiln {

enum class EagerMode {
  DeferNever,                  // strict eager: each op is enqueued at once, asynchronously
  DeferNeverAndLaunchBlocking,  // debug: every op waits for its kernel, so faults name the op
  DeferAndFuse                  // ops are recorded and run as fused graphs at flushes (exec/deferred.h)
};

EagerMode eager_mode();                // the calling thread's current mode
void set_default_eager_mode(EagerMode mode);  // process-wide default
const char* eager_mode_name(EagerMode mode);

// Leaving deferred mode (a guard's scope ends, or the default changes) does not run pending work
// by itself: the first strict-eager op, host read or explicit sync flushes it (cause mode_switch
// for the former), so a guard's destructor never throws.
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
