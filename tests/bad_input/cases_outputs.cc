// Bad-input corpus: --out / --report targets. Whatever the path names that is not a regular file
// (or nothing yet in a writable folder) is refused before any work, with the flag, the path and
// what was expected, and left exactly as it was (docs/outputs.md).
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <tuple>

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

// A success case: `args` writes `wrote` (so only the models are watched).
Case writing(std::string name, std::vector<std::string> args, const fs::path& wrote) {
  Case c;
  c.name = std::move(name);
  c.args = std::move(args);
  c.exit_code = 0;
  c.expect = {"wrote " + wrote.string()};
  c.forbid = {"cannot write"};
  return c;
}

// Links in a sticky world-writable folder (as /tmp): the kernel's protected_symlinks rule, which
// kiln applies itself since it follows the link and renames in the target's folder. Refusing one
// that another user planted needs a link owned by someone else: lchown to nobody (65534) needs
// root, as in CI. Without root those cases cannot be made; the cases that links owned by the
// caller (who also owns the folder) are still followed always run, so the rule is never skipped
// unseen: the corpus prints a note saying which cases ran.
void add_planted_link_cases(Corpus& corpus) {
  const fs::path sticky = corpus.scratch() / "sticky";
  fs::create_directories(sticky);
  ::chmod(sticky.c_str(), 01777);
  const auto gen = [&](std::vector<std::string> extra) {
    return corpus.generate(corpus.tiny_model(), std::move(extra));
  };
  // A file only root may write, and links to it.
  const fs::path victim = sticky / "victim.png";
  std::ofstream(victim) << "root's own file";
  ::chmod(victim.c_str(), 0600);
  const fs::path planted = sticky / "planted.png", planted_json = sticky / "planted.json";
  fs::create_symlink(victim, planted);
  fs::create_symlink(victim, planted_json);
  const uid_t nobody = 65534;
  const bool can_chown = ::geteuid() != nobody && ::lchown(planted.c_str(), nobody, nobody) == 0 &&
                         ::lchown(planted_json.c_str(), nobody, nobody) == 0;

  // Always: a link the caller owns in the sticky folder is followed as before.
  const fs::path own = sticky / "own.png", own_target = sticky / "own_target.png";
  fs::create_symlink(own_target, own);
  Case own_case = writing("outputs/own-link-in-sticky-folder-is-followed", gen({"--out", own.string()}), own);
  own_case.watch = {corpus.models_dir()};
  corpus.add(std::move(own_case));
  if (!can_chown) {
    std::printf("note: not root (cannot lchown a link to uid %u): the planted-link cases are not made; "
                "outputs/own-link-in-sticky-folder-is-followed checks the rule's other side\n",
                unsigned(nobody));
    return;
  }
  const std::string why = "symlink owned by uid 65534 in the sticky world-writable folder " + sticky.string();
  for (const auto& [name, flag, link] : {std::tuple{"out", "--out", planted}, {"report", "--report", planted_json}}) {
    Case c = failing(std::string("outputs/") + name + "-planted-link-in-sticky-folder", gen({flag, link.string()}),
                     {"cannot write " + link.string() + " (" + flag + "): it is a " + why, "protected_symlinks"});
    c.watch = {sticky, corpus.out_dir(), corpus.models_dir()};  // the victim keeps its bytes and mode
    corpus.add(std::move(c));
  }
  // Reached through a link of our own elsewhere: the planted one in the chain is refused too.
  const fs::path via = corpus.out_dir() / "via_planted.png";
  fs::create_symlink(planted, via);
  Case chain = failing("outputs/out-link-to-planted-link", gen({"--out", via.string()}),
                       {"cannot write " + via.string() + " (--out): its target " + planted.string() + " is a " + why});
  chain.watch = {sticky, corpus.out_dir(), corpus.models_dir()};
  corpus.add(std::move(chain));
  // A sticky folder owned by nobody: nobody's link there is the folder owner's, so it is followed.
  const fs::path theirs = corpus.scratch() / "sticky_nobody";
  fs::create_directories(theirs);
  ::chmod(theirs.c_str(), 01777);
  if (::chown(theirs.c_str(), nobody, nobody) == 0) {
    const fs::path link = theirs / "link.png";
    fs::create_symlink(sticky / "theirs_target.png", link);
    if (::lchown(link.c_str(), nobody, nobody) == 0) {
      Case c = writing("outputs/folder-owners-link-in-sticky-folder-is-followed", gen({"--out", link.string()}), link);
      c.watch = {corpus.models_dir()};
      corpus.add(std::move(c));
    }
  }
}

// Names too long for the folder: the final name, or only the temporary `.NAME.tmp.PID.N` that is
// written first. Both are refused before any work (they used to fail after the whole run).
void add_long_name_cases(Corpus& corpus) {
  const fs::path out = corpus.out_dir();
  const auto gen = [&](std::vector<std::string> extra) {
    return corpus.generate(corpus.tiny_model(), std::move(extra));
  };
  const fs::path fits_alone = out / (std::string(246, 'a') + ".png");  // 250 bytes: fits NAME_MAX 255
  const fs::path too_long = out / (std::string(296, 'b') + ".png");    // 300 bytes
  corpus.add(failing("outputs/out-name-too-long-for-the-temporary", gen({"--out", fits_alone.string()}),
                     {"cannot write " + fits_alone.string() + " (--out): its name is 250 bytes",
                      "the temporary kiln writes first (.NAME.tmp.PID.N) would be", "NAME_MAX of 255",
                      "expected a name of at most"},
                     {}, {"loading"}));
  corpus.add(failing("outputs/report-name-too-long-for-the-temporary",
                     gen({"--report", (out / (std::string(245, 'c') + ".json")).string()}),
                     {"(--report): its name is 250 bytes", "NAME_MAX"}, {}, {"loading"}));
  corpus.add(failing("outputs/out-name-over-name-max", gen({"--out", too_long.string()}),
                     {"(--out): its name is 300 bytes, more than the 255", "(NAME_MAX)"}, {}, {"loading"}));
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

  add_planted_link_cases(corpus);
  add_long_name_cases(corpus);

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
