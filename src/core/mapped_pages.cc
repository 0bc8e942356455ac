#include "core/mapped_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace kiln {

void release_mapped_pages(const void* data, size_t bytes) {
  const auto page = uintptr_t(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const auto end = (reinterpret_cast<uintptr_t>(data) + bytes) / page * page;
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

}  // namespace kiln
