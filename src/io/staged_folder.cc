#include "io/staged_folder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <system_error>

#include "core/error.h"
#include "io/output_file.h"

namespace kiln::io {

namespace fs = std::filesystem;

namespace {

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

// The folder's temporaries: ".NAME.<where>.PID".
std::string temp_prefix(const fs::path& target, const char* where) {
  std::string s = ".";  // appended piece by piece: GCC 12 misreports "." + string (-Wrestrict)
  s += target.filename().string();
  s += ".";
  s += where;
  s += ".";
  return s;
}

// Removes the temporaries of `target` that a killed run left (their PID no longer alive).
void remove_stale_folders(const fs::path& target, const char* where) {
  const std::string prefix = temp_prefix(target, where);
  std::error_code ec;
  for (auto it = fs::directory_iterator(target.parent_path(), ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid = n.substr(prefix.size());
    if (pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!io::temporary_owner_is_gone(std::stol(pid))) continue;
    std::error_code rm;
    if (it->symlink_status(rm).type() == fs::file_type::directory) fs::remove_all(it->path(), rm);
  }
}

// Creates the missing ancestors of `target` (as mkdir -p); returns them, top first.
std::vector<fs::path> create_parents(const fs::path& target, const fs::path& shown, const char* kWhere) {
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path p = target.parent_path(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.insert(missing.begin(), p);
    if (p == p.parent_path()) break;
  }
  for (const fs::path& p : missing) {
    fs::create_directory(p, ec);
    KILN_CHECK(!ec, kWhere, "cannot create ", p.string(), " (the parent of ", shown.string(), "): ", ec.message());
  }
  KILN_CHECK(fs::is_directory(target.parent_path(), ec), kWhere, "cannot write ", shown.string(), ": ",
             target.parent_path().string(), " is not a folder");
  return missing;
}

// Refuses a DIR that exists as anything but an empty folder.
void check_target(const fs::path& target, const fs::path& shown, const char* kWhere) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(target, ec);
  if (ec || st.type() == fs::file_type::not_found) return;
  KILN_CHECK(st.type() != fs::file_type::symlink, kWhere, shown.string(),
             " is a symlink; give a new folder name (or an empty folder) to write into");
  KILN_CHECK(st.type() == fs::file_type::directory, kWhere, shown.string(),
             " exists and is not a folder; give a new folder name (or an empty folder) to write into");
  KILN_CHECK(fs::is_empty(target, ec) && !ec, kWhere, shown.string(),
             " is not empty; give a new folder name (or an empty folder): ", kWhere, " never writes over files");
}

// ---- removing the temporary when a signal ends the run ----
//
// SIGINT (Ctrl-C), SIGTERM (kill) and SIGHUP (a closed terminal) used to leave the temporary —
// as big as the model — behind until the next run of the same DIR. While armed, a handler
// removes it (and the parents the run created, if still empty), then lets the signal end the
// process as it would have, so the exit status still says which signal. The handler may only
// make async-signal-safe calls: the removal is openat/getdents64/unlinkat on paths prepared
// before arming, with no allocation. SIGKILL cannot be caught: remove_stale_folders covers it.

constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

enum CleanupState : int { kDisarmed, kArmed, kCleaning };
std::atomic<int> g_cleanup_state{kDisarmed};  // lock-free, so the handler may read and swap it
static_assert(std::atomic<int>::is_always_lock_free);
pid_t g_cleanup_thread = 0;                  // the thread that writes (creates files in) the temporary
std::string g_cleanup_temp;                  // set before arming, read-only while armed
std::vector<std::string> g_cleanup_parents;  // created parents, innermost first

struct linux_dirent64 {  // getdents64's record (glibc's wrapper is not in every version)
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[256];  // NUL-terminated, within d_reclen
};

bool is_dot_or_dotdot(const char* n) { return n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0)); }

// rm -r of `name` under `dirfd` with system calls only (async-signal-safe); symlinks are removed,
// never followed. make-random's tree is 3 levels deep; deeper than 16 is left alone.
void remove_tree_now(int dirfd, const char* name, int depth) {
  if (::unlinkat(dirfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM) || depth > 16) return;
  const int fd = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  alignas(8) char buf[4096];
  // Entries removed while listing may shift the listing: list again until the folder goes.
  for (int pass = 0; ::unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno == ENOTEMPTY && pass < 4; ++pass) {
    ::lseek(fd, 0, SEEK_SET);
    for (long n; (n = ::syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0;)
      for (long off = 0; off < n;) {
        const auto* d = reinterpret_cast<const linux_dirent64*>(buf + off);
        off += d->d_reclen;
        if (!is_dot_or_dotdot(d->d_name)) remove_tree_now(fd, d->d_name, depth + 1);
      }
  }
  ::close(fd);
}

void remove_temporary_on_signal(int sig) {
  const int saved = errno;
  // Only the writing thread stops writing when interrupted: a signal that another thread (a
  // worker) caught is passed on to it, so no file is created after the removal.
  if (pid_t(::syscall(SYS_gettid)) != g_cleanup_thread) {
    const int state = g_cleanup_state.load();
    if (state == kArmed) ::syscall(SYS_tgkill, ::getpid(), g_cleanup_thread, sig);
    if (state != kDisarmed) {  // passed on, or the writer is removing it and then ends the process
      errno = saved;
      return;
    }
  } else if (int armed = kArmed; g_cleanup_state.compare_exchange_strong(armed, kCleaning)) {
    remove_tree_now(AT_FDCWD, g_cleanup_temp.c_str(), 0);
    for (const std::string& p : g_cleanup_parents) ::rmdir(p.c_str());  // only if empty
  }
  // The default action, delivered when this handler returns: the usual "killed by" status.
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);
  errno = saved;
}

void fsync_folder(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

// Arms the handler above for `temp` while alive; restores the previous handlers when destroyed.
// A signal that was ignored (nohup's SIGHUP) stays ignored.
class StagedFolder::RemoveOnSignal {
 public:
  RemoveOnSignal(const fs::path& temp, const std::vector<fs::path>& created_parents) {
    g_cleanup_temp = temp.string();
    g_cleanup_parents.clear();
    for (auto it = created_parents.rbegin(); it != created_parents.rend(); ++it)
      g_cleanup_parents.push_back(it->string());
    g_cleanup_thread = pid_t(::syscall(SYS_gettid));
    g_cleanup_state.store(kArmed);
    struct sigaction sa{};
    sa.sa_handler = remove_temporary_on_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : kCleanupSignals) sigaddset(&sa.sa_mask, sig);  // one cleanup at a time
    for (size_t i = 0; i < std::size(kCleanupSignals); ++i) {
      installed_[i] = ::sigaction(kCleanupSignals[i], nullptr, &previous_[i]) == 0 &&
                      previous_[i].sa_handler != SIG_IGN && ::sigaction(kCleanupSignals[i], &sa, nullptr) == 0;
    }
  }
  // Called once the temporary is renamed into place (or removed): nothing left to clean.
  void disarm() { g_cleanup_state.store(kDisarmed); }
  ~RemoveOnSignal() {
    disarm();
    for (size_t i = 0; i < std::size(kCleanupSignals); ++i)
      if (installed_[i]) ::sigaction(kCleanupSignals[i], &previous_[i], nullptr);
  }
  RemoveOnSignal(const RemoveOnSignal&) = delete;
  RemoveOnSignal& operator=(const RemoveOnSignal&) = delete;

 private:
  struct sigaction previous_[std::size(kCleanupSignals)] {};
  bool installed_[std::size(kCleanupSignals)] = {};
};

StagedFolder::StagedFolder(const fs::path& dir, uint64_t needed, const char* where) : where_(where), shown_(dir) {
  const char* kWhere = where;
  KILN_CHECK(!dir.empty(), kWhere, "the output folder is \"\"; expected a folder name");
  target_ = fs::absolute(dir).lexically_normal();
  if (target_.filename().empty()) target_ = target_.parent_path();  // "out/" names "out"
  KILN_CHECK(!target_.filename().empty() && target_.filename() != "." && target_.filename() != "..", kWhere,
             "cannot write ", dir.string(), ": expected a folder name");
  check_target(target_, dir, kWhere);
  created_ = create_parents(target_, dir, kWhere);
  const fs::path parent = target_.parent_path();
  temp_ = parent / (temp_prefix(target_, where) + std::to_string(::getpid()));
  try {  // a constructor that throws runs no destructor: undo what was made here
    std::error_code ec;
    const fs::space_info space = fs::space(parent, ec);
    KILN_CHECK(ec || space.available >= needed, kWhere, "cannot write ", dir.string(), ": it needs ", gib(needed),
               " but ", parent.string(), " has ", gib(space.available), " free");
    remove_stale_folders(target_, where);
    cleanup_ = std::make_unique<RemoveOnSignal>(temp_, created_);  // armed before the temporary exists
    fs::create_directory(temp_, ec);
    KILN_CHECK(!ec, kWhere, "cannot create ", temp_.string(), ": ", ec.message());
  } catch (...) {
    undo();
    throw;
  }
}

StagedFolder::~StagedFolder() {
  if (!committed_) undo();
}

void StagedFolder::undo() {
  cleanup_.reset();  // disarmed: the removal below is this thread's
  std::error_code ec;
  fs::remove_all(temp_, ec);
  for (auto it = created_.rbegin(); it != created_.rend(); ++it) fs::remove(*it, ec);  // only if still empty
}

void StagedFolder::commit() {
  for (const auto& e : fs::recursive_directory_iterator(temp_))
    if (e.is_directory()) fsync_folder(e.path());
  fsync_folder(temp_);
  if (::rename(temp_.c_str(), target_.c_str()) != 0)
    fail(where_, "cannot rename ", temp_.string(), " to ", shown_.string(), ": ", std::strerror(errno));
  committed_ = true;
  cleanup_->disarm();  // DIR is complete: a signal from now on removes nothing
  fsync_folder(target_.parent_path());
}

}  // namespace kiln::io
