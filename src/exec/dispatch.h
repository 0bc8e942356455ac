// The dispatcher every op call goes through. In strict eager mode an op is "a plan of one
// node": validated and shape-inferred on the host (errors raise here, at the call), its
// output allocated, and its kernel enqueued on the device queue; the call returns before
// the kernel runs. View ops only create a new view of their input's buffer.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "core/attrs.h"
#include "core/tensor.h"

namespace kiln {

// `device` places factory ops (no tensor inputs); ops with inputs run on their inputs' device.
Tensor dispatch(const std::string& op, std::vector<Tensor> inputs, Attrs attrs = {},
                std::optional<Device> device = std::nullopt);

}  // namespace kiln
