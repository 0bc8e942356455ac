// A device's kernels by op name, one type for every device (the CPU's and CUDA's tables): each
// kernel, and what inputs it takes (DeviceRuntime::supports). Each kernel family file adds its
// entries; the runtime answers kernel() and supports() from the table.
#pragma once
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "devices/runtime.h"

namespace kiln {

struct DeviceKernel {
  using Takes = std::function<bool(const std::vector<OperandMeta>&)>;
  // Implicit, so a family adds `table["op"] = &kernel` or `table["op"] = {&kernel, takes}`.
  DeviceKernel(KernelFn run = nullptr, Takes takes = nullptr) : run(run), takes(std::move(takes)) {}
  KernelFn run;
  Takes takes;  // null: every input the device's kernels load
};

using KernelTable = std::unordered_map<std::string, DeviceKernel>;

// The kernel of `op`, or null.
inline KernelFn find_kernel(const KernelTable& table, const std::string& op) {
  const auto it = table.find(op);
  return it == table.end() ? nullptr : it->second.run;
}

// Whether the table has `op` and its kernel takes these inputs.
inline bool table_supports(const KernelTable& table, const std::string& op, const std::vector<OperandMeta>& inputs) {
  const auto it = table.find(op);
  return it != table.end() && (!it->second.takes || it->second.takes(inputs));
}

}  // namespace kiln
