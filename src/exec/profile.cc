#include "exec/profile.h"

#include <atomic>
#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>

namespace kiln {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_on{false};
std::atomic<ProfileDetail> g_detail{ProfileDetail::ops};
// Bumped by reset_profile(): a queue's "last launch ended" from before a reset is not a gap;
// the first launch after it was idle since the reset.
std::atomic<uint64_t> g_generation{0};
std::atomic<Clock::rep> g_reset_at{0};
std::mutex g_mu;
Profile& data() {
  static auto* p = new Profile;  // leaked: launches may finish during exit
  return *p;
}
// The enqueuing thread's component, since when it is current, and when the last scope closed.
thread_local std::string t_component = kPipelineComponent;
thread_local Clock::time_point t_scope_start{}, t_scope_closed{};

// Per device queue (the thread that runs the launches): when and for whom its last launch ended.
struct LastEnd {
  Clock::time_point at;
  std::string component;
  uint64_t generation = ~uint64_t{0};
};
thread_local LastEnd t_last_end;

double seconds(Clock::time_point from, Clock::time_point to) {
  return to > from ? std::chrono::duration<double>(to - from).count() : 0.0;
}

std::string shape_str(DType dtype, const Shape& shape, const Strides& strides) {
  std::string s = std::string(dtype_name(dtype)) + to_string(shape);
  if (!strides.empty() && strides != contiguous_strides(shape)) s.append("{strides ").append(to_string(strides)).append("}");
  return s;
}

}  // namespace

std::string ProfiledLaunch::signature() const {
  std::string s = op;
  for (size_t i = 0; i < shapes.size(); ++i) s.append(" ").append(shape_str(dtypes[i], shapes[i], strides[i]));
  const std::string a = attrs.str();
  if (!a.empty()) s.append(" ").append(a);
  return s;
}

double Profile::component_seconds(const std::string& component) const {
  double s = 0;
  for (const auto& [key, p] : by_op)
    if (key.first == component) s += p.seconds;
  return s;
}

void set_profiling(bool on, ProfileDetail detail) {
  g_detail = detail;
  g_on = on;
}

bool profiling() { return g_on.load(std::memory_order_relaxed); }

Profile profile() {
  std::lock_guard<std::mutex> lock(g_mu);
  return data();
}

void reset_profile() {
  std::lock_guard<std::mutex> lock(g_mu);
  data() = Profile{};
  g_reset_at = Clock::now().time_since_epoch().count();
  ++g_generation;
}

ProfileScope::ProfileScope(std::string component) : previous_(std::move(t_component)) {
  t_component = std::move(component);
  t_scope_start = Clock::now();
}
ProfileScope::~ProfileScope() {
  t_component = std::move(previous_);
  t_scope_start = t_scope_closed = Clock::now();
}

namespace detail {

uint64_t operand_bytes(const std::vector<Tensor>& tensors) {
  uint64_t bytes = 0;
  for (const Tensor& t : tensors)
    if (t.defined()) bytes += uint64_t(t.nbytes());
  return bytes;
}

std::function<void()> profiled(const std::string& op, uint64_t bytes, std::function<void()> work,
                               const std::vector<Tensor>* operands, const Attrs* attrs) {
  if (!profiling()) return work;
  std::optional<ProfiledLaunch> launch;
  if (operands && g_detail == ProfileDetail::shapes) {
    launch.emplace();
    for (const Tensor& t : *operands) {
      launch->shapes.push_back(t.shape());
      launch->strides.push_back(t.strides());
      launch->dtypes.push_back(t.dtype());
    }
    if (attrs) launch->attrs = *attrs;
  }
  return [op, bytes, work = std::move(work), component = t_component, scope_start = t_scope_start,
          scope_closed = t_scope_closed, generation = g_generation.load(), launch = std::move(launch)]() mutable {
    const Clock::time_point start = Clock::now();
    work();
    const Clock::time_point end = Clock::now();
    // The device was idle from the previous launch's end (or the reset) to this start. The part
    // before the enqueuing thread closed its last scope is the previous component's tail, the
    // part before this launch's scope opened is the pipeline's, the rest is this component's.
    const bool same = t_last_end.generation == generation;
    const Clock::time_point idle_since = same ? t_last_end.at : Clock::time_point(Clock::duration(g_reset_at.load()));
    const std::string previous = same ? t_last_end.component : std::string(kPipelineComponent);
    const Clock::time_point closed = std::max(idle_since, std::min(start, scope_closed));
    const Clock::time_point opened = std::max(closed, std::min(start, scope_start));
    t_last_end = {end, component, generation};
    std::lock_guard<std::mutex> lock(g_mu);
    if (generation != g_generation) return;  // reset while it was queued
    Profile& p = data();
    OpProfile& row = p.by_op[{component, op}];
    row.seconds += seconds(start, end);
    ++row.launches;
    row.bytes += bytes;
    const std::pair<std::string, double> idle[] = {{previous, seconds(idle_since, closed)},
                                                   {kPipelineComponent, seconds(closed, opened)},
                                                   {component, seconds(opened, start)}};
    for (const auto& [who, s] : idle)
      if (s > 0) p.by_op[{who, kIdleOp}].seconds += s;
    if (!launch) return;
    launch->component = component;
    launch->op = op;
    const std::string sig = launch->signature();
    for (ProfiledLaunch& l : p.launches)
      if (l.component == component && l.signature() == sig) {
        l.cost.seconds += seconds(start, end), ++l.cost.launches, l.cost.bytes += bytes;
        return;
      }
    launch->cost = {seconds(start, end), 1, bytes};
    p.launches.push_back(std::move(*launch));
  };
}

}  // namespace detail

}  // namespace kiln
