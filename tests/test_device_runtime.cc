// The device runtime's seams (devices/runtime.h): copies between buffers ordered on the queue,
// to_device(), the registry by device type, and the op-support check every dispatch makes.
#include <gtest/gtest.h>

#include <cstring>

#include "devices/runtime.h"
#include "exec/dispatch.h"
#include "exec/host.h"
#include "exec/mode.h"
#include "exec/ops.h"
#include "test_util.h"

namespace kiln {
namespace {

TEST(DeviceRuntime, TheCpuIsAHostDeviceAndCopiesInQueueOrder) {
  DeviceRuntime& rt = runtime(Device::cpu());
  EXPECT_TRUE(rt.is_host());
  // The copy's source is written by a kernel still queued ahead of it: the copy sees its value.
  const Tensor x = from_vector({1, 2, 3, 4}, {4});
  const Tensor y = mul(x, x);
  BufferPtr dst = rt.allocate_staging(y.nbytes());
  const uint64_t seq = rt.copy(y.buffer(), 0, dst, 0, y.nbytes());
  EXPECT_GE(seq, y.buffer()->ready_seq());
  rt.wait_for(seq);
  float got[4];
  std::memcpy(got, dst->data(), sizeof got);
  EXPECT_EQ(std::vector<float>(got, got + 4), (std::vector<float>{1, 4, 9, 16}));
  // Offsets on both sides, and a range past the end refused naming both buffers' sizes.
  BufferPtr part = rt.allocate(8);
  rt.wait_for(rt.copy(y.buffer(), 8, part, 0, 8));
  EXPECT_EQ(to_vector(Tensor::view_of(part, {2}, DType::f32)), (std::vector<float>{9, 16}));
  test::expect_error([&] { rt.copy(y.buffer(), 12, part, 0, 8); },
                     {"[copy]", "8 bytes from offset 12 of a 16-byte buffer"});
}

TEST(DeviceRuntime, ToDeviceMakesADenseCopyInItsOwnBuffer) {
  for (EagerMode mode : {EagerMode::DeferNever, EagerMode::DeferAndFuse}) {
    EagerModeGuard guard(mode);
    const Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
    const Tensor xt = transpose(add(x, x), 0, 1);  // strided, and deferred in deferred mode
    const Tensor y = to_device(xt, Device::cpu());
    EXPECT_TRUE(y.is_contiguous());
    EXPECT_EQ(y.shape(), (Shape{3, 2}));
    EXPECT_NE(y.buffer(), xt.buffer());
    EXPECT_EQ(to_vector(y), (std::vector<float>{2, 8, 4, 10, 6, 12}));
    // A bf16 tensor keeps its bits.
    const Tensor b = from_vector({0.1f, -3.5f}, {2}, DType::bf16);
    EXPECT_EQ(to_vector(to_device(b, Device::cpu())), to_vector(b));
  }
}

// On the test device (the CPU here; cuda:0 under scripts/gpu-check.sh): host data up, ops there,
// a strided view back down, and a copy between two of its buffers.
TEST(DeviceRuntime, ToTheTestDeviceAndBack) {
  const Device device = test::test_device();
  const Tensor x = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor on = to_device(x, device);
  EXPECT_EQ(on.device(), device);
  const Tensor y = transpose(mul(on, on), 0, 1);
  EXPECT_EQ(to_vector(y), (std::vector<float>{1, 16, 4, 25, 9, 36}));
  const Tensor back = to_device(y, Device::cpu());
  EXPECT_EQ(back.device(), Device::cpu());
  EXPECT_EQ(to_vector(back), to_vector(y));
  EXPECT_EQ(to_vector(to_device(on, device)), to_vector(x));
  EXPECT_EQ(runtime(device).is_host(), device == Device::cpu());
}

TEST(DeviceRuntime, ADeviceThisBuildOrMachineLacksIsAClearError) {
  // Built without the CUDA backend, the registry names what it has; built with it on a machine
  // without a GPU, the CUDA runtime says why it cannot start. Either way: no crash, the device named.
  test::expect_error([] { runtime(Device::parse("cuda:0")); }, {"[device] cuda:0 is not available"});
  test::expect_error([] { runtime(Device::parse("cpu:1")); }, {"[device] cpu:1 does not exist"});
  test::expect_error([] { from_vector({1}, {1}, DType::f32, Device::parse("cuda:0")); }, {"cuda:0"});
}

TEST(DeviceRuntime, AnOpTheDeviceDoesNotRunIsRefusedNamingTheInputs) {
  EXPECT_EQ(&runtime_for("add", Device::cpu(), {{{2}, DType::f32}, {{2}, DType::f32}}), &runtime(Device::cpu()));
  test::expect_error([] { runtime_for("no_such_op", Device::cpu(), {{{2, 3}, DType::bf16}}); },
                     {"[no_such_op] has no kernel on cpu:0 for inputs (bf16[2,3])"});
}

}  // namespace
}  // namespace kiln
