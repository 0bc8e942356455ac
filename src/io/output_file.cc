#include "io/output_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>

#include "core/error.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxSymlinkHops = 40;  // as the kernel's ELOOP limit

std::string kind_of(mode_t m) {
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// "it" for the path itself, "its target T" once symlinks were followed.
std::string subject(const fs::path& path, const fs::path& target) {
  return target == path ? "it" : "its target " + target.string();
}

// The problem with the file `target` (already final) being written, "" for none.
std::string target_problem(const fs::path& path, const fs::path& target, const struct stat& st) {
  if (S_ISDIR(st.st_mode)) return subject(path, target) + " is a folder; expected a file name";
  if (!S_ISREG(st.st_mode)) {
    const std::string kind = kind_of(st.st_mode);
    return subject(path, target) + (kind.starts_with("a ") ? " is " + kind + ", not a regular file" : " is " + kind) +
           "; kiln writes only regular files";
  }
  return "";
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// The path as messages show it ("" quoted, so an empty one is visible).
std::string shown(const fs::path& path) { return path.empty() ? std::string("\"\"") : path.string(); }

// Numbers the temporaries this process writes (with its PID, unique among concurrent writers).
std::atomic<uint64_t> g_temporary_counter{0};

// The temporary the write of `name` goes to first: ".NAME.tmp.PID.N".
std::string temporary_name(const std::string& name, uint64_t n) {
  return "." + name + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(n);
}

// The kernel's protected_symlinks rule (fs.protected_symlinks = 1, the default), applied by hand:
// kiln follows an output's links itself and renames a temporary onto the final target, so the
// kernel never gets to apply it. In a sticky world-writable folder (/tmp), a link is followed only
// when the caller (euid) or the folder's owner owns it; otherwise anyone could plant a link there
// that makes a root run replace a file of root's choosing. "" when `link` (lstat()ed as `lst`)
// may be followed; else why not, with `who` the subject ("it" or "its target T").
std::string planted_link_problem(const std::string& who, const fs::path& link, const struct stat& lst) {
  const fs::path dir = link.parent_path().empty() ? fs::path(".") : link.parent_path();
  struct stat dst{};
  if (::stat(dir.c_str(), &dst) != 0) return "";  // the folder check reports it
  if ((dst.st_mode & (S_ISVTX | S_IWOTH)) != (S_ISVTX | S_IWOTH)) return "";
  if (lst.st_uid == ::geteuid() || lst.st_uid == dst.st_uid) return "";
  return who + " is a symlink owned by uid " + std::to_string(lst.st_uid) + " in the sticky world-writable folder " +
         dir.string() + " (owned by uid " + std::to_string(dst.st_uid) + "); expected a link owned by the caller (uid " +
         std::to_string(::geteuid()) +
         ") or by the folder's owner, as the kernel's protected_symlinks rule requires (another user may have "
         "planted this one)";
}

// Whether the final target's name and its temporary's fit the limits of `dir` (pathconf NAME_MAX
// and PATH_MAX): checked with the rule, so that a long --out fails before the run, not when the
// temporary cannot be created after it. The temporary's N is reserved 6 digits (or more, once this
// process has written that many). "" when they fit.
std::string length_problem(const fs::path& path, const fs::path& target, const fs::path& dir) {
  long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX), path_max = ::pathconf(dir.c_str(), _PC_PATH_MAX);
  if (name_max <= 0) name_max = NAME_MAX;
  if (path_max <= 0) path_max = PATH_MAX;
  const std::string name = target.filename().string();
  const std::string tmp = temporary_name(name, std::max<uint64_t>(g_temporary_counter.load() + 100, 999999));
  const std::string whose = target == path ? "its name" : "the name of its target " + target.string();
  if (name.size() > size_t(name_max))
    return whose + " is " + std::to_string(name.size()) + " bytes, more than the " + std::to_string(name_max) +
           " that folder " + dir.string() + " allows (NAME_MAX)";
  if (tmp.size() > size_t(name_max))
    return whose + " is " + std::to_string(name.size()) +
           " bytes, and the temporary kiln writes first (.NAME.tmp.PID.N) would be " + std::to_string(tmp.size()) +
           ", more than the folder's NAME_MAX of " + std::to_string(name_max) + ": expected a name of at most " +
           std::to_string(size_t(name_max) - (tmp.size() - name.size())) + " bytes";
  const size_t full = (dir / tmp).string().size() + 1;  // with the terminating NUL, as PATH_MAX counts
  if (full > size_t(path_max))
    return "the temporary kiln writes first, " + (dir / tmp).string() + ", would be a path of " +
           std::to_string(full) + " bytes, more than the " + std::to_string(path_max) +
           " that PATH_MAX allows: expected a shorter path";
  return "";
}

}  // namespace

std::string output_problem(const fs::path& path, fs::path* target) {
  if (path.empty()) return "the path is empty; expected a file name";
  // Follow the last component's symlinks one by one (a dangling one ends the walk).
  fs::path p = path;
  struct stat st{};
  bool exists = false;
  for (int hops = 0;; ++hops) {
    if (p.string().back() == '/')
      return (p == path ? std::string("it ends in '/'") : subject(path, p) + " ends in '/'") +
             ", which names a folder; expected a file name";
    if (::lstat(p.c_str(), &st) != 0) {
      // Nothing there yet (the folder check says why), or a name too long (the length check says).
      if (errno == ENOENT || errno == ENOTDIR || errno == ENAMETOOLONG) break;
      return std::string(std::strerror(errno)) + (p == path ? "" : " (at its target " + p.string() + ")");
    }
    if (!S_ISLNK(st.st_mode)) {
      exists = true;
      break;
    }
    if (std::string planted = planted_link_problem(subject(path, p), p, st); !planted.empty()) return planted;
    if (hops == kMaxSymlinkHops) return "too many levels of symbolic links";
    std::error_code ec;
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) return "cannot read the symlink " + p.string() + ": " + ec.message();
    p = to.is_absolute() ? to : p.parent_path() / to;  // relative links resolve against the link's folder
  }
  if (exists) {
    std::string problem = target_problem(path, p, st);
    if (!problem.empty()) return problem;
  }
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  struct stat dst{};
  if (::stat(dir.c_str(), &dst) != 0) {
    const int err = errno;
    if (err == ENOENT) return "folder " + dir.string() + " does not exist (" + std::strerror(err) + ")";
    return "folder " + dir.string() + ": " + std::strerror(err);
  }
  if (!S_ISDIR(dst.st_mode)) return dir.string() + " is not a folder (" + std::strerror(ENOTDIR) + ")";
  if (::access(dir.c_str(), W_OK) != 0)
    return "folder " + dir.string() + " is not writable (" + std::strerror(errno) + ")";
  if (std::string too_long = length_problem(path, p, dir); !too_long.empty()) return too_long;
  if (target) *target = p;
  return "";
}

fs::path resolve_output(const std::string& what, const fs::path& path) {
  fs::path target;
  const std::string problem = output_problem(path, &target);
  if (!problem.empty())
    fail("output", "cannot write ", shown(path), what.empty() ? "" : " (" + what + ")", ": ", problem);
  return target;
}

bool same_output_file(const fs::path& a, const fs::path& b) {
  fs::path ta = a, tb = b;
  if (!output_problem(a, &ta).empty()) ta = a;
  if (!output_problem(b, &tb).empty()) tb = b;
  struct stat sa{}, sb{};
  const bool ea = ::stat(ta.c_str(), &sa) == 0, eb = ::stat(tb.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  // Neither exists yet: the same name in the same folder (the folders' own links followed).
  std::error_code ec1, ec2;
  const fs::path ca = fs::weakly_canonical(fs::absolute(ta), ec1), cb = fs::weakly_canonical(fs::absolute(tb), ec2);
  if (ec1 || ec2) return fs::absolute(ta).lexically_normal() == fs::absolute(tb).lexically_normal();
  return ca == cb;
}

bool temporary_owner_is_gone(long pid) {
  if (pid <= 0 || pid > INT_MAX || pid == long(::getpid())) return false;
  return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;
}

int remove_stale_temporaries(const fs::path& folder, const std::string& name) {
  const std::string prefix = "." + name + ".tmp.";
  int removed = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(folder, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = n.substr(prefix.size());  // "<pid>.<n>"
    const size_t dot = rest.find('.');
    if (dot == std::string::npos || !all_digits(rest.substr(0, dot)) || !all_digits(rest.substr(dot + 1)) || dot > 9)
      continue;
    if (!temporary_owner_is_gone(std::stol(rest.substr(0, dot)))) continue;
    struct stat st{};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  return removed;
}

void write_output_atomically(const std::string& where, const fs::path& path,
                             const std::function<void(std::FILE*)>& write) {
  auto fail_write = [&](const std::string& reason) { fail(where, "cannot write ", shown(path), ": ", reason); };
  fs::path target;
  const std::string problem = output_problem(path, &target);
  if (!problem.empty()) fail_write(problem);
  const fs::path dir = target.parent_path();
  const std::string name = target.filename().string();
  remove_stale_temporaries(dir.empty() ? fs::path(".") : dir, name);

  struct stat old{};
  const bool replacing = ::lstat(target.c_str(), &old) == 0 && S_ISREG(old.st_mode);
  // A unique name next to the final target, so the rename is atomic (same file system).
  fs::path tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    tmp = dir / temporary_name(name, g_temporary_counter.fetch_add(1));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, replacing ? 0600 : 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) fail_write(std::strerror(errno));
  std::string reason;
  if (replacing) {  // keep the replaced file's owner (where allowed) and mode
    if (::fchown(fd, old.st_uid, old.st_gid) != 0) {
      // Not ours to give away (not root): the new file is ours, as with mv.
    }
    if (::fchmod(fd, old.st_mode & 07777) != 0) reason = std::strerror(errno);
  }
  FILE* f = reason.empty() ? ::fdopen(fd, "wb") : nullptr;
  if (!f) {
    if (reason.empty()) reason = std::strerror(errno);
    ::close(fd);
    ::unlink(tmp.c_str());
    fail_write(reason);
  }

  errno = 0;
  try {
    write(f);
  } catch (...) {
    std::fclose(f);
    ::unlink(tmp.c_str());
    throw;
  }
  if (std::ferror(f)) reason = std::string("write failed: ") + std::strerror(errno ? errno : EIO);
  if (reason.empty() && (std::fflush(f) != 0 || ::fsync(::fileno(f)) != 0)) reason = std::strerror(errno);
  if (std::fclose(f) != 0 && reason.empty()) reason = std::strerror(errno);
  // The target may have changed since the check: never rename over anything but a regular file.
  struct stat now{};
  if (reason.empty() && ::lstat(target.c_str(), &now) == 0 && !S_ISREG(now.st_mode))
    reason = S_ISLNK(now.st_mode) ? subject(path, target) + " became a symlink while writing"
                                  : target_problem(path, target, now);
  if (reason.empty() && std::rename(tmp.c_str(), target.c_str()) != 0) reason = std::strerror(errno);
  if (!reason.empty()) {
    ::unlink(tmp.c_str());
    fail_write(reason);
  }
  // The rename itself survives a crash once the folder is synced.
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace kiln::io
