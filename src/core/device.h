// Devices are named by a type and an index ("cpu", "cuda:1").
#pragma once
#include <string>

namespace kiln {

enum class DeviceType { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  static Device parse(const std::string& name);  // "cpu", "cpu:0", "cuda:1"
  static Device cpu() { return Device{DeviceType::cpu, 0}; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};


}  // namespace kiln
