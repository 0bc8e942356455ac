#include "exec/mode.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/env.h"

namespace kiln {

namespace {

EagerMode mode_from_env() {
  if (env::flag("KILN_LAUNCH_BLOCKING")) return EagerMode::DeferNeverAndLaunchBlocking;
  return env::flag("KILN_DEFER_AND_FUSE") ? EagerMode::DeferAndFuse : EagerMode::DeferNever;
}

std::atomic<EagerMode>& default_mode() {
  static std::atomic<EagerMode> mode{mode_from_env()};
  return mode;
}

thread_local bool t_has_override = false;
thread_local EagerMode t_override = EagerMode::DeferNever;

}  // namespace

EagerMode eager_mode() { return t_has_override ? t_override : default_mode().load(); }

void set_default_eager_mode(EagerMode mode) { default_mode().store(mode); }

const char* eager_mode_name(EagerMode mode) {
  switch (mode) {
    case EagerMode::DeferNever: return "eager";
    case EagerMode::DeferNeverAndLaunchBlocking: return "eager-launch-blocking";
    case EagerMode::DeferAndFuse: return "defer";
  }
  return "?";
}

EagerModeGuard::EagerModeGuard(EagerMode mode) : had_override_(t_has_override), previous_(t_override) {
  t_has_override = true;
  t_override = mode;
}

EagerModeGuard::~EagerModeGuard() {
  t_has_override = had_override_;
  t_override = previous_;
}

}  // namespace kiln
