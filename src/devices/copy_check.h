// The checks every accelerator's DeviceRuntime::copy makes before queuing a copy: both byte
// ranges inside their buffers, and each end either this device or host memory.
#pragma once
#include <cstddef>

#include "core/buffer.h"

namespace kiln {

struct CopyEnds {
  bool from_host = false, to_host = false;
};

// Throws "[copy] ..." naming the sizes or the devices; returns which ends are host memory.
CopyEnds check_copy(const Device& device, const BufferPtr& src, size_t src_offset, const BufferPtr& dst,
                    size_t dst_offset, size_t bytes);

}  // namespace kiln
