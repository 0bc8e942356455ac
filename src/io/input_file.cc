#include "io/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

// The problem with a node of mode `mode` (already stat()ed), "" for a regular file.
std::string mode_problem(mode_t mode) {
  if (S_ISREG(mode)) return "";
  return "is " + node_kind(mode) + ", not a regular file";
}

// The problem for a failed stat()/open() with `err`.
std::string errno_problem(const char* doing, int err) {
  if (err == ENOENT || err == ENOTDIR) return std::string("does not exist (") + std::strerror(err) + ")";
  return std::string("cannot be ") + doing + " (" + std::strerror(err) + ")";
}

}  // namespace

std::string node_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symlink";
  return "an unknown kind of file";
}

std::string input_file_problem(const fs::path& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return errno_problem("read", errno);
  return mode_problem(st.st_mode);
}

void check_input_file(const std::string& where, const std::string& what, const fs::path& path,
                      const std::string& expected) {
  const std::string problem = input_file_problem(path);
  if (!problem.empty()) fail(where, what, " ", problem, "; expected ", expected);
}

int open_input_file(const fs::path& path, std::string* problem) {
  // stat() first: a device is never even opened (opening some has side effects).
  *problem = input_file_problem(path);
  if (!problem->empty()) return -1;
  // O_NONBLOCK: if a FIFO replaced the file since the stat, open() returns at once instead of
  // waiting for a writer; fstat() below then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    *problem = errno_problem("opened", errno);
    return -1;
  }
  struct stat st{};
  if (::fstat(fd, &st) != 0) *problem = errno_problem("read", errno);
  else *problem = mode_problem(st.st_mode);
  // A regular file's reads never block; clearing the flag keeps its reads plain all the same.
  if (problem->empty() && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
    *problem = errno_problem("read", errno);
  if (!problem->empty()) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string read_input_file(const std::string& where, const fs::path& path, const std::string& expected) {
  std::string problem;
  const int fd = open_input_file(path, &problem);
  if (fd < 0) fail(where, path.string(), " ", problem, "; expected ", expected);
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail(where, path.string(), " cannot be read (", std::strerror(err), ")");
    }
    if (n == 0) break;
    text.append(buf, size_t(n));
  }
  ::close(fd);
  return text;
}

}  // namespace kiln::io
