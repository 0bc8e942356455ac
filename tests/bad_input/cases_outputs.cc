// Bad-input corpus: --out / --report targets. Whatever the path names that is not a regular file
// (or nothing yet in a writable folder) is refused before any work, with the flag, the path and
// what was expected, and left exactly as it was (docs/outputs.md).
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "corpus.h"

namespace kiln::corpus {

namespace {

// A socket node at `path` (left behind by closing the socket, as a dead server leaves one).
bool make_socket(const fs::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.string().size() >= sizeof addr.sun_path) {
    ::close(fd);
    return false;
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}


}  // namespace

void add_output_cases(Corpus& corpus) {
  const fs::path out = corpus.out_dir();
  const fs::path fifo = out / "fifo.png", sock = out / "sock.png", folder = out / "taken.png";
  ::mkfifo(fifo.c_str(), 0644);
  make_socket(sock);
  fs::create_directories(folder);
  fs::create_symlink(fifo, out / "to_fifo.png");
  fs::create_symlink("fifo.png", out / "to_fifo_relative.json");
  fs::create_symlink(out / "missing" / "x.png", out / "dangling_into_missing.png");
  fs::create_symlink("a.png", out / "to_a.json");  // dangling: a.png does not exist yet
  const auto gen = [&](std::vector<std::string> extra) {
    return corpus.generate(corpus.tiny_model(), std::move(extra));
  };
  const std::string regular = " not a regular file; kiln writes only regular files";

  corpus.add(failing("outputs/out-fifo", gen({"--out", fifo.string()}),
                     {"[output] cannot write " + fifo.string() + " (--out)", "is a FIFO," + regular}));
  corpus.add(failing("outputs/report-fifo", gen({"--report", fifo.string()}),
                     {"[output] cannot write " + fifo.string() + " (--report)", "is a FIFO," + regular}));
  corpus.add(failing("outputs/out-socket", gen({"--out", sock.string()}),
                     {"cannot write " + sock.string() + " (--out)", "is a socket," + regular}));
  corpus.add(failing("outputs/report-socket", gen({"--report", sock.string()}),
                     {"cannot write " + sock.string() + " (--report)", "is a socket," + regular}));
  corpus.add(failing("outputs/out-symlink-to-fifo", gen({"--out", (out / "to_fifo.png").string()}),
                     {"cannot write " + (out / "to_fifo.png").string() + " (--out)", "its target " + fifo.string(),
                      "is a FIFO"}));
  corpus.add(failing("outputs/report-relative-symlink-to-fifo",
                     gen({"--report", (out / "to_fifo_relative.json").string()}),
                     {"(--report): ", "its target", "fifo.png is a FIFO"}));
  // A character device of our own (/dev/null's numbers): needs CAP_MKNOD, as root in CI.
  const fs::path node = out / "null.png";
  if (::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0) {
    corpus.add(failing("outputs/out-char-device", gen({"--out", node.string()}),
                       {"cannot write " + node.string() + " (--out)", "is a character device," + regular}));
    corpus.add(failing("outputs/report-char-device", gen({"--report", node.string()}),
                       {"cannot write " + node.string() + " (--report)", "is a character device"}));
  }
  corpus.add(failing("outputs/out-existing-folder", gen({"--out", folder.string()}),
                     {"cannot write " + folder.string() + " (--out)", "is a folder; expected a file name"}));
  corpus.add(failing("outputs/report-existing-folder", gen({"--report", out.string()}),
                     {"cannot write " + out.string() + " (--report)", "is a folder"}));
  corpus.add(failing("outputs/out-empty", gen({"--out", ""}),
                     {"cannot write \"\" (--out)", "the path is empty; expected a file name"}));
  corpus.add(failing("outputs/report-empty", gen({"--report", ""}), {"cannot write \"\" (--report)", "empty"}));
  corpus.add(failing("outputs/out-trailing-slash", gen({"--out", (out / "somedir").string() + "/"}),
                     {"cannot write " + (out / "somedir").string() + "/ (--out)", "ends in '/'",
                      "expected a file name"}));
  corpus.add(failing("outputs/out-missing-folder", gen({"--out", (out / "missing" / "x.png").string()}),
                     {"(--out): ", "folder " + (out / "missing").string() + " does not exist"}));
  corpus.add(failing("outputs/report-missing-folder", gen({"--report", (out / "missing" / "run.json").string()}),
                     {"(--report): ", "does not exist"}));
  corpus.add(failing("outputs/out-dangling-symlink-into-missing-folder",
                     gen({"--out", (out / "dangling_into_missing.png").string()}),
                     {"(--out): ", "folder " + (out / "missing").string() + " does not exist"}));
  corpus.add(failing("outputs/out-and-report-same-file", gen({"--report", (out / "out.png").string()}),
                     {"--out " + (out / "out.png").string(), "--report", "name the same file"}));
  corpus.add(failing("outputs/out-and-report-same-file-through-a-link",
                     gen({"--out", (out / "a.png").string(), "--report", (out / "to_a.json").string()}),
                     {"name the same file"}));
  corpus.add(failing("outputs/inspect-report-fifo",
                     {"inspect", "--model", corpus.tiny_model().string(), "--report", fifo.string()},
                     {"cannot write " + fifo.string() + " (--report)", "is a FIFO"}));
  corpus.add(failing("outputs/warmup-report-fifo", {"warmup", "--sizes", "32x32", "--report", fifo.string()},
                     {"cannot write " + fifo.string() + " (--report)", "is a FIFO"}, {"KILN_CACHE_DIR=none"}));
  corpus.add(failing("outputs/warmup-report-socket",
                     {"warmup", "--model", corpus.tiny_model().string(), "--sizes", "32x32", "--report",
                      sock.string()},
                     {"cannot write " + sock.string() + " (--report)", "is a socket"}, {"KILN_CACHE_DIR=none"}));

  // A run killed mid-write left `.out.png.tmp.999999.0` (no such process): the next run
  // succeeds. It writes, so the watched tree is the models' only; that the temporary is gone
  // is checked by tests/test_output_file.cc (OutputFile.CliRunCleansAStaleTemporary...).
  const fs::path stale = corpus.scratch() / "stale";
  fs::create_directories(stale);
  std::ofstream(stale / ".out.png.tmp.999999.0") << "partial";
  Case success;
  success.name = "outputs/stale-temporary-then-success";
  success.args = gen({"--out", (stale / "out.png").string()});
  success.exit_code = 0;
  success.expect = {"wrote " + (stale / "out.png").string()};
  success.forbid = {"cannot write"};
  success.watch = {corpus.models_dir()};
  corpus.add(std::move(success));
}

}  // namespace kiln::corpus
