// Devices are named by a type and an index ("cpu", "cuda:1", "pjrt:0", "tpu:0"). A pjrt device is
// a device of a PJRT plugin (XLA's plugin API); tpu is the same with the TPU plugin, libtpu.
#pragma once
#include <string>

namespace kiln {

enum class DeviceType { cpu, cuda, pjrt, tpu };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device parse(const std::string& name);  // "cpu", "cpu:0", "cuda:1", "pjrt", "tpu:0"
  static Device cpu() { return Device{DeviceType::cpu, 0}; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// The device factories and ops use when no tensor says where (torch's default device): the CPU
// unless a DefaultDeviceGuard on this thread says otherwise.
Device default_device();

// Makes `device` this thread's default device while alive (nested guards restore in order).
class DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(const Device& device);
  ~DefaultDeviceGuard();
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;

 private:
  Device previous_;
};

}  // namespace kiln
