#include "devices/copy_check.h"

#include "core/error.h"

namespace kiln {

CopyEnds check_copy(const Device& device, const BufferPtr& src, size_t src_offset, const BufferPtr& dst,
                    size_t dst_offset, size_t bytes) {
  KILN_CHECK(src_offset + bytes <= src->bytes() && dst_offset + bytes <= dst->bytes(), "copy", "copying ", bytes,
             " bytes from offset ", src_offset, " of a ", src->bytes(), "-byte buffer to offset ", dst_offset, " of a ",
             dst->bytes(), "-byte buffer");
  const bool from_here = src->device() == device, to_here = dst->device() == device;
  const CopyEnds ends{src->device().type == DeviceType::cpu, dst->device().type == DeviceType::cpu};
  KILN_CHECK((from_here || ends.from_host) && (to_here || ends.to_host), "copy", device.str(),
             " copies between itself and host memory, not from ", src->device().str(), " to ", dst->device().str());
  return ends;
}

}  // namespace kiln
