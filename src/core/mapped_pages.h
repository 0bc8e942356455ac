// The pages of a read-only file mapping that lie wholly inside [data, data + bytes) leave the
// process's resident set (madvise MADV_DONTNEED). The bytes stay readable: a later read faults
// them in from the file again (from the page cache while the kernel keeps them). For weights
// whose bytes now live elsewhere: a converted copy, or a device copy under model offload.
#pragma once
#include <cstddef>

namespace kiln {

void release_mapped_pages(const void* data, size_t bytes);

}  // namespace kiln
