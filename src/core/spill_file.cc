#include "core/spill_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace kiln {

namespace {

size_t page_size() { return size_t(sysconf(_SC_PAGESIZE)); }

// Gives back what a failed write appended (best effort: the file is nameless anyway).
void truncate_to(int fd, size_t bytes) {
  if (::ftruncate(fd, off_t(bytes)) != 0) errno = 0;
}

}  // namespace

std::shared_ptr<SpillFile> SpillFile::create(const std::filesystem::path& dir) {
  // O_TMPFILE: a file with no name at all. Where the filesystem lacks it, a named one unlinked at once.
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    std::string name = (dir / "kiln-spill-XXXXXX").string();
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  KILN_CHECK(fd >= 0, "offload", "cannot create a spill file in ", dir.string(), ": ", std::strerror(errno));
  return std::shared_ptr<SpillFile>(new SpillFile(dir, fd));
}

SpillFile::~SpillFile() { ::close(fd_); }

SpillFile::Mapping SpillFile::write(const void* data, size_t bytes) {
  KILN_CHECK(bytes > 0, "offload", "internal: an empty spill");
  const size_t page = page_size();
  const size_t start = end_, length = (bytes + page - 1) / page * page;
  // Reserve the blocks first, so a full disk is an error here rather than SIGBUS on a later read.
  if (const int e = ::posix_fallocate(fd_, off_t(start), off_t(length)); e != 0) {
    truncate_to(fd_, start);
    fail("offload", "cannot spill ", bytes, " bytes into ", dir_.string(), ": ", std::strerror(e));
  }
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::pwrite(fd_, p + done, bytes - done, off_t(start + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : EIO;
      truncate_to(fd_, start);
      fail("offload", "cannot spill ", bytes, " bytes into ", dir_.string(), ": ", std::strerror(e));
    }
    done += size_t(n);
  }
  void* m = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd_, off_t(start));
  if (m == MAP_FAILED) {
    const int e = errno;
    truncate_to(fd_, start);
    fail("offload", "cannot map ", bytes, " spilled bytes in ", dir_.string(), ": ", std::strerror(e));
  }
  end_ = start + length;
  // The mapping keeps the file's blocks alive by itself; they are freed when the last mapping
  // goes and the descriptor is closed.
  return {m, std::shared_ptr<void>(m, [length](void* q) { ::munmap(q, length); })};
}

FolderSpace folder_space(const std::filesystem::path& dir) {
  FolderSpace s;
  struct statvfs v;
  if (::statvfs(dir.c_str(), &v) == 0) s.free_bytes = size_t(v.f_bavail) * size_t(v.f_frsize);
  struct statfs f;
  if (::statfs(dir.c_str(), &f) == 0) s.in_memory = f.f_type == TMPFS_MAGIC || f.f_type == RAMFS_MAGIC;
  return s;
}

}  // namespace kiln
