// Strict eager semantics: ops return before their kernels run, host reads wait, counters,
// the launch-blocking debug mode, the scoped mode guard and asynchronous error reporting.
#include <atomic>
#include <condition_variable>
#include <mutex>

#include "devices/runtime.h"
#include "exec/counters.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "test_util.h"

namespace kiln {
namespace {

// Holds the CPU queue's worker until release() so tests can observe asynchrony.
class QueueGate {
 public:
  QueueGate() {
    runtime(Device::cpu()).enqueue("gate", [this] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return open_; });
    }, 0);
  }
  ~QueueGate() { release(); }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(StrictEager, OpsReturnBeforeTheirKernelsRunAndReadsWait) {
  EagerModeGuard strict(EagerMode::DeferNever);
  const Tensor x = test::random_tensor({64, 64}, 3);
  synchronize();
  DeviceRuntime& rt = runtime(Device::cpu());
  QueueGate gate;
  reset_counters();
  const Tensor y = exp(x) * 2.0 + 1.0;  // three kernels, all queued behind the gate
  EXPECT_EQ(counters().kernels_launched, 3u);
  EXPECT_LT(rt.completed(), rt.last_enqueued());  // nothing has run yet: the calls returned at once
  gate.release();
  const auto v = to_vector(y);
  const Counters c = counters();
  EXPECT_EQ(c.sync_points, 1u);
  EXPECT_EQ(rt.completed(), rt.last_enqueued());
  const auto xs = to_vector(x);
  EXPECT_NEAR(v[5], std::exp(xs[5]) * 2 + 1, 1e-4);
  EXPECT_EQ(counters().host_waits, c.host_waits);  // x was ready: that read did not block
}

TEST(StrictEager, CountsOpsKernelsAndHostWaits) {
  synchronize();
  reset_counters();
  const Tensor a = ones({8, 8});
  const Tensor b = transpose(a, 0, 1);  // view: op, no kernel
  const Tensor c = matmul(a, b);
  (void)item(sum(c));
  const Counters k = counters();
  EXPECT_EQ(k.ops_dispatched, 5u);  // ones, transpose, the dense copy of b, matmul, sum
  EXPECT_EQ(k.kernels_launched, 4u);  // ones, matmul (b copied to dense first), sum
  EXPECT_EQ(k.sync_points, 1u);
  EXPECT_LE(k.host_waits, 1u);
}

// The host may run up to 32 kernels ahead, but not hold more than the queue's output bytes
// (KILN_MAX_PENDING_BYTES, 256 MiB): a chain of 32 MiB results keeps a few alive, not 32.
TEST(StrictEager, TheHostWaitsRatherThanAllocateFarAheadOfTheDevice) {
  DeviceRuntime& rt = runtime(Device::cpu());
  ASSERT_EQ(rt.max_in_flight_bytes(), size_t(256) << 20);
  const int64_t n = int64_t(8) << 20;  // 32 MiB of f32
  Tensor x = ones({n});
  synchronize();
  rt.reset_peak_memory();
  const size_t base = rt.memory().in_use_bytes;
  for (int i = 0; i < 40; ++i) x = x * 1.0001;  // each result replaces the last
  synchronize();
  const size_t peak = rt.memory().peak_bytes - base, each = rt.allocation_size(size_t(n) * 4);
  // Queued outputs within the budget, one over it, and the value the host holds.
  EXPECT_LE(peak, rt.max_in_flight_bytes() + 3 * each) << peak / each << " results alive at once";
}

TEST(StrictEager, LaunchBlockingWaitsForEveryOp) {
  synchronize();
  DeviceRuntime& rt = runtime(Device::cpu());
  EagerModeGuard guard(EagerMode::DeferNeverAndLaunchBlocking);
  reset_counters();
  const Tensor y = exp(ones({128, 128}));
  EXPECT_EQ(rt.completed(), rt.last_enqueued());
  EXPECT_EQ(counters().host_waits, 2u);
}

TEST(StrictEager, ModeGuardRestoresOnScopeExitAndOnExceptions) {
  const EagerMode outside = eager_mode();  // the process default (KILN_DEFER_AND_FUSE may set it)
  try {
    EagerModeGuard guard(EagerMode::DeferNeverAndLaunchBlocking);
    EXPECT_EQ(eager_mode(), EagerMode::DeferNeverAndLaunchBlocking);
    {
      EagerModeGuard inner(EagerMode::DeferNever);
      EXPECT_EQ(eager_mode(), EagerMode::DeferNever);
    }
    EXPECT_EQ(eager_mode(), EagerMode::DeferNeverAndLaunchBlocking);
    throw std::runtime_error("leave");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(eager_mode(), outside);
}

TEST(StrictEager, GuardIsPerThread) {
  const EagerMode outside = eager_mode();
  EagerModeGuard guard(EagerMode::DeferNeverAndLaunchBlocking);
  EagerMode seen = EagerMode::DeferNeverAndLaunchBlocking;
  std::thread([&] { seen = eager_mode(); }).join();
  EXPECT_EQ(seen, outside);
}

TEST(StrictEager, DeviceFaultsSurfaceAtTheNextSyncNamingTheOp) {
  const Tensor table = ones({4, 3});
  const Tensor idx = from_ints({0, 7}, {2});
  const Tensor rows = gather(table, idx);  // the bad index is only seen by the kernel
  test::expect_error([&] { to_vector(rows); }, {"gather", "index 7", "out of range [0, 4)"});
  // The queue stays usable after the error was reported.
  EXPECT_EQ(item(sum(ones({3}))), 3.0);
}

TEST(StrictEager, LaunchBlockingRaisesDeviceFaultsAtTheOp) {
  EagerModeGuard guard(EagerMode::DeferNeverAndLaunchBlocking);
  test::expect_error([&] { gather(ones({4, 3}), from_ints({9}, {1})); }, {"gather", "index 9"});
}

TEST(StrictEager, DroppingHandlesBeforeKernelsRunIsSafe) {
  DeviceRuntime& rt = runtime(Device::cpu());
  synchronize();
  const size_t base = rt.memory().in_use_bytes;
  {
    QueueGate gate;
    {
      const Tensor a = ones({512, 512});
      const Tensor b = tanh(a) + a;  // queued, then every handle goes out of scope
    }
    gate.release();
    synchronize();
  }
  EXPECT_EQ(rt.memory().in_use_bytes, base);  // buffers came back once the work finished
}

}  // namespace
}  // namespace kiln
