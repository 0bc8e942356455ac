// Output files (io/output_file.h): symlinks are written through, never replaced; folders,
// devices, FIFOs and sockets are refused and left as they are; stale temporaries of killed runs
// are cleaned up; a failed write leaves the original file byte for byte.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/output_file.h"
#include "io/png.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

class OutputFile : public ::testing::Test {
 protected:
  void SetUp() override {
    static int n = 0;  // short names: a socket path has room for 107 bytes
    dir_ = fs::temp_directory_path() / ("kof_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_ / "ro", fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }

  std::vector<std::string> listing(const fs::path& d) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  std::vector<std::string> listing() const { return listing(dir_); }
  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static bool is_link(const fs::path& p) { return fs::is_symlink(fs::symlink_status(p)); }
  static void write_png(const fs::path& p, uint8_t value = 7) {
    const std::vector<uint8_t> rgb(4 * 4 * 3, value);
    io::write_png(p, rgb.data(), 4, 4, {{"seed", std::to_string(value)}});
  }
  static uint8_t first_pixel(const fs::path& p) { return io::read_png(p).rgb.at(0); }
  // A pid that is certainly not alive: a child that has exited and been reaped.
  static pid_t dead_pid() {
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(0);
    int status = 0;
    ::waitpid(pid, &status, 0);
    return pid;
  }

  fs::path dir_;
};

TEST_F(OutputFile, SymlinkIsWrittenThroughAndStaysALink) {
  std::ofstream(dir_ / "real.png") << "old content";
  fs::create_symlink(dir_ / "real.png", dir_ / "link.png");
  EXPECT_EQ(io::resolve_output("--out", dir_ / "link.png"), dir_ / "real.png");
  write_png(dir_ / "link.png", 9);
  EXPECT_TRUE(is_link(dir_ / "link.png"));
  EXPECT_EQ(fs::read_symlink(dir_ / "link.png"), dir_ / "real.png");
  EXPECT_EQ(first_pixel(dir_ / "real.png"), 9);
  EXPECT_EQ(listing(), (std::vector<std::string>{"link.png", "real.png"}));  // no temporary left
  // A dangling link: the write creates its target, the link stays.
  fs::create_symlink(dir_ / "new.png", dir_ / "dangling.png");
  write_png(dir_ / "dangling.png", 3);
  EXPECT_TRUE(is_link(dir_ / "dangling.png"));
  EXPECT_EQ(first_pixel(dir_ / "new.png"), 3);
}

TEST_F(OutputFile, RelativeSymlinkResolvesAgainstTheLinksFolder) {
  fs::create_directories(dir_ / "a");
  fs::create_directories(dir_ / "b");
  fs::create_symlink("../b/real.png", dir_ / "a" / "link.png");
  EXPECT_EQ(io::resolve_output("--out", dir_ / "a" / "link.png"), dir_ / "a" / ".." / "b" / "real.png");
  write_png(dir_ / "a" / "link.png", 5);
  EXPECT_TRUE(is_link(dir_ / "a" / "link.png"));
  EXPECT_EQ(first_pixel(dir_ / "b" / "real.png"), 5);
  EXPECT_EQ(listing(dir_ / "a"), std::vector<std::string>{"link.png"});  // the temporary went next to the target
  EXPECT_EQ(listing(dir_ / "b"), std::vector<std::string>{"real.png"});
  // A relative link given by a relative path (the folder of the link is "").
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  fs::create_symlink("b/real.png", "rel.png");
  write_png("rel.png", 6);
  fs::current_path(cwd);
  EXPECT_TRUE(is_link(dir_ / "rel.png"));
  EXPECT_EQ(first_pixel(dir_ / "b" / "real.png"), 6);
}

TEST_F(OutputFile, ChainOfSymlinksEndsAtTheLastTarget) {
  fs::create_directories(dir_ / "deep");
  write_png(dir_ / "deep" / "real.png", 1);
  fs::create_symlink("deep/real.png", dir_ / "l3");
  fs::create_symlink(dir_ / "l3", dir_ / "l2");
  fs::create_symlink("l2", dir_ / "l1.png");
  write_png(dir_ / "l1.png", 2);
  for (const char* l : {"l1.png", "l2", "l3"}) EXPECT_TRUE(is_link(dir_ / l)) << l;
  EXPECT_EQ(first_pixel(dir_ / "deep" / "real.png"), 2);
  EXPECT_EQ(listing(dir_ / "deep"), std::vector<std::string>{"real.png"});
  // A loop is refused clearly.
  fs::create_symlink("loop_b", dir_ / "loop_a");
  fs::create_symlink("loop_a", dir_ / "loop_b");
  test::expect_error([&] { io::resolve_output("--out", dir_ / "loop_a"); },
                     {"[output] cannot write " + (dir_ / "loop_a").string() + " (--out)",
                      "too many levels of symbolic links"});
}

TEST_F(OutputFile, FifoIsRefusedWithoutBlocking) {
  const fs::path fifo = dir_ / "out.png";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  fs::create_symlink(fifo, dir_ / "to_fifo.png");
  const auto t0 = std::chrono::steady_clock::now();
  test::expect_error([&] { io::resolve_output("--out", fifo); },
                     {"[output] cannot write " + fifo.string() + " (--out)", "is a FIFO, not a regular file",
                      "kiln writes only regular files"});
  test::expect_error([&] { io::resolve_output("--report", dir_ / "to_fifo.png"); },
                     {(dir_ / "to_fifo.png").string() + " (--report)", "its target " + fifo.string(), "is a FIFO"});
  test::expect_error([&] { write_png(fifo); }, {"[png] cannot write " + fifo.string(), "is a FIFO"});
  test::expect_error([&] { write_png(dir_ / "to_fifo.png"); }, {"[png] cannot write", "is a FIFO"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_TRUE(fs::is_fifo(fs::symlink_status(fifo)));
  EXPECT_TRUE(is_link(dir_ / "to_fifo.png"));
  EXPECT_EQ(listing(), (std::vector<std::string>{"out.png", "to_fifo.png"}));
}

TEST_F(OutputFile, SocketIsRefused) {
  const fs::path sock = dir_ / "sock";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.string().size(), sizeof addr.sun_path);
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  test::expect_error([&] { io::resolve_output("--report", sock); },
                     {"[output] cannot write " + sock.string() + " (--report)", "is a socket, not a regular file"});
  test::expect_error([&] { write_png(sock); }, {"[png] cannot write", "is a socket"});
  EXPECT_TRUE(fs::is_socket(fs::symlink_status(sock)));
  ::close(fd);
}

TEST_F(OutputFile, DevicesAreRefusedAndStayDevices) {
  // /dev/null exists everywhere: as root a rename would have made it a regular file. Only the
  // check is run on it (a regression must not break the machine's /dev/null); writes go to a
  // node of our own below.
  test::expect_error([&] { io::resolve_output("--out", "/dev/null"); },
                     {"[output] cannot write /dev/null (--out)", "is a character device, not a regular file"});
  struct stat st{};
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // A device node of our own (needs CAP_MKNOD; root in CI containers).
  const fs::path node = dir_ / "null.png";
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    test::expect_error([&] { write_png(node); }, {"[png] cannot write " + node.string(), "character device"});
    ASSERT_EQ(::lstat(node.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
    EXPECT_EQ(st.st_rdev, makedev(1, 3));
    EXPECT_EQ(listing(), std::vector<std::string>{"null.png"});
  }
}

TEST_F(OutputFile, FolderNamesAndMissingFoldersAreRefused) {
  fs::create_directories(dir_ / "taken.png");
  struct Case {
    fs::path path;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {"", {"[output] cannot write \"\" (--out): the path is empty; expected a file name"}},
      {dir_.string() + "/somedir/", {"ends in '/', which names a folder; expected a file name"}},
      {dir_ / "taken.png", {"cannot write " + (dir_ / "taken.png").string() + " (--out): it is a folder"}},
      {dir_ / ".", {"is a folder"}},
      {dir_ / "missing" / "x.png", {"folder " + (dir_ / "missing").string() + " does not exist"}},
      {dir_ / "missing" / "deeper" / "x.png", {"does not exist"}},
  };
  for (const Case& c : cases) test::expect_error([&] { io::resolve_output("--out", c.path); }, c.parts);
  // The parent is a regular file.
  std::ofstream(dir_ / "file") << "x";
  test::expect_error([&] { io::resolve_output("--out", dir_ / "file" / "x.png"); },
                     {(dir_ / "file").string() + " is not a folder", "Not a directory"});
  // A link to a folder is a folder.
  fs::create_directory_symlink(dir_ / "taken.png", dir_ / "to_dir.png");
  test::expect_error([&] { io::resolve_output("--out", dir_ / "to_dir.png"); }, {"its target", "is a folder"});
  // A dangling link into a missing folder names the final target's folder.
  fs::create_symlink(dir_ / "nowhere" / "x.png", dir_ / "dangling.png");
  test::expect_error([&] { io::resolve_output("--out", dir_ / "dangling.png"); },
                     {"folder " + (dir_ / "nowhere").string() + " does not exist"});
  EXPECT_EQ(listing(), (std::vector<std::string>{"dangling.png", "file", "taken.png", "to_dir.png"}));
  EXPECT_TRUE(listing(dir_ / "taken.png").empty());
}

TEST_F(OutputFile, UnwritableFolderIsRefused) {
  fs::create_directories(dir_ / "ro");
  fs::permissions(dir_ / "ro", fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                   fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  // The rule is access(W_OK) on the final target's folder: the verdict follows it. As root
  // (CI containers) access() ignores permission bits, so the 0555 folder is accepted there;
  // only a non-root run can assert the refusal of this folder.
  const bool writable = ::access((dir_ / "ro").c_str(), W_OK) == 0;
  EXPECT_EQ(writable, ::geteuid() == 0);
  if (writable) {
    EXPECT_EQ(io::resolve_output("--out", dir_ / "ro" / "x.png"), dir_ / "ro" / "x.png");
  } else {
    test::expect_error([&] { io::resolve_output("--out", dir_ / "ro" / "x.png"); },
                       {"folder " + (dir_ / "ro").string() + " is not writable", "Permission denied"});
    // Through a link in a writable folder: the target's folder is the one checked.
    fs::create_symlink(dir_ / "ro" / "x.png", dir_ / "link.png");
    test::expect_error([&] { write_png(dir_ / "link.png"); }, {"[png] cannot write", "is not writable"});
  }
  // A read-only mount refuses even root: /proc/sys is one in most containers.
  struct stat st{};
  if (::stat("/proc/sys", &st) == 0 && ::access("/proc/sys", W_OK) != 0 && errno == EROFS)
    test::expect_error([&] { io::resolve_output("--out", "/proc/sys/kiln.png"); },
                       {"folder /proc/sys is not writable", "Read-only file system"});
  EXPECT_TRUE(listing(dir_ / "ro").empty());
}

TEST_F(OutputFile, StaleTemporariesOfDeadRunsAreRemovedLiveOnesKept) {
  const std::string dead = std::to_string(dead_pid()), live = std::to_string(::getpid());
  const std::vector<std::string> stale = {".out.png.tmp." + dead + ".0", ".out.png.tmp." + dead + ".17"};
  const std::vector<std::string> kept = {".out.png.tmp." + live + ".0",  // a live writer (this process)
                                         ".out.png.tmp.1.0",             // init is alive
                                         ".other.png.tmp." + dead + ".0",  // another name's
                                         ".out.png.tmp.x.0", ".out.png.tmp." + dead, "out.png.tmp." + dead + ".0"};
  for (const auto& n : stale) std::ofstream(dir_ / n) << "partial";
  for (const auto& n : kept) std::ofstream(dir_ / n) << "partial";
  write_png(dir_ / "out.png", 4);
  EXPECT_EQ(first_pixel(dir_ / "out.png"), 4);
  for (const auto& n : stale) EXPECT_FALSE(fs::exists(dir_ / n)) << n;
  for (const auto& n : kept) EXPECT_TRUE(fs::exists(dir_ / n)) << n;
  EXPECT_EQ(listing().size(), kept.size() + 1);
  // Through a symlink, the target's folder and name are the ones cleaned.
  fs::create_directories(dir_ / "t");
  std::ofstream(dir_ / "t" / (".real.png.tmp." + dead + ".3")) << "partial";
  fs::create_symlink("t/real.png", dir_ / "link.png");
  write_png(dir_ / "link.png");
  EXPECT_EQ(listing(dir_ / "t"), std::vector<std::string>{"real.png"});
  EXPECT_EQ(io::remove_stale_temporaries(dir_, "out.png"), 0);
}

TEST_F(OutputFile, FailedWriteLeavesTheOriginalByteIdentical) {
  write_png(dir_ / "out.png", 8);
  const std::string before = read(dir_ / "out.png");
  // The writer fails half way.
  test::expect_error([&] {
    io::write_output_atomically("png", dir_ / "out.png", [](FILE* f) {
      std::fputs("half a png", f);
      fail("png", "encoder gave up");
    });
  }, {"[png] encoder gave up"});
  EXPECT_EQ(read(dir_ / "out.png"), before);
  // Any exception is passed on the same way.
  EXPECT_THROW(io::write_output_atomically("report", dir_ / "out.png",
                                           [](FILE*) { throw std::runtime_error("boom"); }),
               std::runtime_error);
  EXPECT_EQ(read(dir_ / "out.png"), before);
  // A refused encode (bad keyword) never touches it either.
  const std::vector<uint8_t> rgb(12, 1);
  test::expect_error([&] { io::write_png(dir_ / "out.png", rgb.data(), 2, 2, {{"", "x"}}); }, {"invalid text keyword"});
  EXPECT_EQ(read(dir_ / "out.png"), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"out.png"});
}

TEST_F(OutputFile, ModesNewFilesFollowTheUmaskReplacedFilesKeepTheirs) {
  const mode_t mask = ::umask(022);
  write_png(dir_ / "new.png");
  EXPECT_EQ(fs::status(dir_ / "new.png").permissions(), fs::perms(0644));
  std::ofstream(dir_ / "kept.png") << "old";
  fs::permissions(dir_ / "kept.png", fs::perms(0640));
  write_png(dir_ / "kept.png", 2);
  EXPECT_EQ(fs::status(dir_ / "kept.png").permissions(), fs::perms(0640));
  EXPECT_EQ(first_pixel(dir_ / "kept.png"), 2);
  ::umask(mask);
}

TEST_F(OutputFile, SameFileThroughLinksAndSpellings) {
  std::ofstream(dir_ / "a.json") << "{}";
  fs::create_symlink("a.json", dir_ / "link.json");
  EXPECT_TRUE(io::same_output_file(dir_ / "a.json", dir_ / "link.json"));
  EXPECT_TRUE(io::same_output_file(dir_ / "a.json", dir_ / "." / "a.json"));
  EXPECT_TRUE(io::same_output_file(dir_ / "x.png", dir_ / "." / "x.png"));
  EXPECT_FALSE(io::same_output_file(dir_ / "a.json", dir_ / "b.json"));
  EXPECT_FALSE(io::same_output_file(dir_ / "x.png", dir_ / "y.png"));
}

// The CLI as a user runs it: a killed run's temporary next to --out is cleaned up by the next
// successful run, which writes through the symlink --out names.
TEST_F(OutputFile, CliRunCleansAStaleTemporaryAndWritesThroughTheLink) {
  const std::string dead = std::to_string(dead_pid());
  std::ofstream(dir_ / (".out.png.tmp." + dead + ".0")) << "partial";
  std::ofstream(dir_ / ".out.png.tmp.999999999.0") << "partial";  // beyond pid_max: never alive
  fs::create_directories(dir_ / "images");
  fs::create_symlink("images/out.png", dir_ / "link.png");
  fs::create_symlink("../out.png", dir_ / "images" / "out.png");  // link -> images/out.png -> out.png
  const std::string model = (fs::path(KILN_FIXTURES_DIR) / "flux1_tiny" / "pipeline").string();
  const std::string cmd = std::string(KILN_CLI_PATH) + " generate --model " + model +
                          " --prompt cat --height 32 --width 32 --steps 1 --max-sequence-length 16 --out " +
                          (dir_ / "link.png").string() + " --report " + (dir_ / "run.json").string() + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), int(buf.size()), p)) output += buf.data();
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  EXPECT_TRUE(is_link(dir_ / "link.png"));
  EXPECT_TRUE(is_link(dir_ / "images" / "out.png"));
  EXPECT_EQ(io::read_png(dir_ / "out.png").width, 32);
  EXPECT_EQ(listing(), (std::vector<std::string>{"images", "link.png", "out.png", "run.json"}));
}

}  // namespace
}  // namespace kiln
