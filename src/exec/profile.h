// Where a run's device time goes (issue 16's `profile.by_op`): seconds, launches and bytes moved
// per launch name (the op in eager mode, "fused_elementwise" or "<op>+epilogue" in deferred and
// compiled modes), per pipeline component. Off by default; when on, every launch is timed on the
// device queue where it runs (two clock reads and a short lock per kernel: cheap enough for
// benchmarks). Time the device spent waiting for the host between launches is its own row,
// kIdleOp, so a stage's rows add up to the stage's wall time and host-bound stages show as such.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/attrs.h"
#include "core/tensor.h"

namespace kiln {

// The row of device time between launches (the queue was empty: the host was busy).
inline constexpr const char* kIdleOp = "(idle: waiting for the host)";
// The component of launches outside every ProfileScope, and of the host's time between scopes
// (a pipeline's own work between its components).
inline constexpr const char* kPipelineComponent = "pipeline";

struct OpProfile {
  double seconds = 0;
  uint64_t launches = 0;
  uint64_t bytes = 0;  // read and written by the launches: each operand's elements once
};

// One distinct eager launch (op, operand shapes, strides, dtypes, attrs), with what it cost: lets
// a benchmark replay each shape alone (ProfileDetail::shapes).
struct ProfiledLaunch {
  std::string component, op;
  std::vector<Shape> shapes;
  std::vector<Strides> strides;
  std::vector<DType> dtypes;
  Attrs attrs;
  OpProfile cost;
  std::string signature() const;  // "conv2d f32[1,512,64,64]{cl} f32[512,512,3,3] ... stride=[1,1]"
};

struct Profile {
  std::map<std::pair<std::string, std::string>, OpProfile> by_op;  // (component, launch name)
  std::vector<ProfiledLaunch> launches;                            // ProfileDetail::shapes only
  // Seconds of all rows of one component (kIdleOp included).
  double component_seconds(const std::string& component) const;
};

enum class ProfileDetail { ops, shapes };
void set_profiling(bool on, ProfileDetail detail = ProfileDetail::ops);
bool profiling();
Profile profile();  // everything since the last reset_profile()
void reset_profile();

// Launches enqueued by this thread while a scope is alive count for `component`, and so does the
// device's idle time from the scope's opening to its first launch (scopes nest; outside any:
// kPipelineComponent). The pipelines open one per component, where its stage's clock starts.
class ProfileScope {
 public:
  explicit ProfileScope(std::string component);
  ~ProfileScope();
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  std::string previous_;
};

namespace detail {
// Bytes of the operands' elements (each view's elements once).
uint64_t operand_bytes(const std::vector<Tensor>& tensors);
// `work` timed into the profile under `op` when profiling is on (else returned as is). `shapes`:
// the eager launch's inputs and output, for ProfileDetail::shapes.
std::function<void()> profiled(const std::string& op, uint64_t bytes, std::function<void()> work,
                               const std::vector<Tensor>* operands = nullptr, const Attrs* attrs = nullptr);
}  // namespace detail

}  // namespace kiln
