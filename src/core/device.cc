#include "core/device.h"

#include "core/error.h"

namespace kiln {

Device Device::parse(const std::string& name) {
  const auto colon = name.find(':');
  const std::string type = name.substr(0, colon);
  Device d;
  if (type == "cpu") {
    d.type = DeviceType::cpu;
  } else if (type == "cuda") {
    d.type = DeviceType::cuda;
  } else if (type == "pjrt") {
    d.type = DeviceType::pjrt;
  } else if (type == "tpu") {
    d.type = DeviceType::tpu;
  } else {
    fail("device", "unknown device '", name, "' (expected cpu, cuda, pjrt or tpu, each optionally :N)");
  }
  if (colon != std::string::npos) {
    const std::string idx = name.substr(colon + 1);
    KILN_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos, "device",
               "bad device index in '", name, "'");
    d.index = std::stoi(idx);
  }
  return d;
}

namespace {
thread_local Device t_default_device = Device::cpu();
}  // namespace

Device default_device() { return t_default_device; }

DefaultDeviceGuard::DefaultDeviceGuard(const Device& device) : previous_(t_default_device) {
  t_default_device = device;
}

DefaultDeviceGuard::~DefaultDeviceGuard() { t_default_device = previous_; }

std::string Device::str() const {
  const char* name = type == DeviceType::cpu ? "cpu" : type == DeviceType::cuda ? "cuda" : type == DeviceType::pjrt ? "pjrt" : "tpu";
  return std::string(name) + ":" + std::to_string(index);
}

}  // namespace kiln
