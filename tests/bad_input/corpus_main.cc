// Runs the bad-input corpus against a `kiln` binary:
//   bad_input_corpus KILN FIXTURES_DIR [--filter TEXT] [--timeout SECONDS] [--fast-timeout SECONDS]
// Prints one line per failed case and a closing "N passed, N failed"; exits non-zero when any
// case failed or none ran.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <algorithm>
#include <map>
#include <stdexcept>
#include <sstream>

#include "corpus.h"

namespace kiln::corpus {
namespace {

struct Run {
  int exit_code = -1;  // -1: killed by a signal or by the timeout
  std::string output;
  bool timed_out = false;
  double seconds = 0;
};

Run run(const std::string& kiln, const Case& c, int timeout_seconds) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    ::close(fds[1]);
    const int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    for (const std::string& e : c.env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv{const_cast<char*>(kiln.c_str())};
    for (const std::string& a : c.args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(kiln.c_str(), argv.data());
    std::fprintf(stderr, "exec %s: %s\n", kiln.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(fds[1]);
  Run r;
  char buf[4096];
  const auto deadline = t0 + std::chrono::seconds(timeout_seconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, int(std::min<int64_t>(left.count(), 1000))) <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    r.output.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// What a tree holds, entry by entry: type, and content (regular files), target (links).
std::map<std::string, std::string> snapshot(const fs::path& root) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(root, ec))) return out;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::none, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path p = it->path();
    struct stat st{};
    if (::lstat(p.c_str(), &st) != 0) continue;
    std::string what;
    if (S_ISREG(st.st_mode)) {
      std::ifstream in(p, std::ios::binary);
      std::ostringstream content;
      content << in.rdbuf();
      what = "file " + std::to_string(st.st_mode & 07777) + " " + std::to_string(std::hash<std::string>{}(content.str())) +
             " " + std::to_string(st.st_size);
    } else if (S_ISLNK(st.st_mode)) {
      what = "link -> " + fs::read_symlink(p, ec).string();
    } else if (S_ISDIR(st.st_mode)) {
      what = "folder " + std::to_string(st.st_mode & 07777);
    } else if (S_ISFIFO(st.st_mode)) {
      what = "fifo";
    } else if (S_ISSOCK(st.st_mode)) {
      what = "socket";
    } else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      what = std::string(S_ISCHR(st.st_mode) ? "char" : "block") + " device " + std::to_string(st.st_rdev);
    }
    out[fs::relative(p, root, ec).string()] = what;
  }
  return out;
}

std::string tree_diff(const std::map<std::string, std::string>& before, const std::map<std::string, std::string>& after) {
  std::string d;
  for (const auto& [k, v] : before) {
    const auto it = after.find(k);
    if (it == after.end()) d += " removed " + k + ";";
    else if (it->second != v) d += " changed " + k + " (" + v + " -> " + it->second + ");";
  }
  for (const auto& [k, v] : after)
    if (!before.count(k)) d += " created " + k + " (" + v + ");";
  return d;
}

}  // namespace

Corpus::Corpus(fs::path scratch, fs::path fixtures) : scratch_(std::move(scratch)), fixtures_(std::move(fixtures)) {
  fs::create_directories(out_dir());
  fs::create_directories(models_dir());
}

fs::path Corpus::copy_model(const std::string& name, const fs::path& from) {
  const fs::path to = models_dir() / name;
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

void Corpus::edit_json(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j;
  {
    std::ifstream in(file);
    in >> j;
  }
  edit(j);
  std::ofstream(file) << j.dump(2) << '\n';
}

fs::path Corpus::sparse_copy(const std::string& name, const std::vector<std::string>& damaged) {
  const fs::path from = fs::absolute(tiny_model()), to = models_dir() / name;
  fs::create_directories(to);
  for (auto it = fs::recursive_directory_iterator(from); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path rel = fs::relative(it->path(), from), dst = to / rel;
    if (it->is_directory()) {
      fs::create_directories(dst);
    } else if (it->file_size() < 64 * 1024 ||
               std::find(damaged.begin(), damaged.end(), rel.generic_string()) != damaged.end()) {
      fs::copy_file(it->path(), dst);
    } else {
      fs::create_symlink(it->path(), dst);
    }
  }
  return to;
}

void Corpus::rewrite_safetensors(const fs::path& file, const nlohmann::json& header, const std::string& data) {
  if (fs::is_symlink(file)) throw std::logic_error(file.string() + " is a link to a fixture; list it in sparse_copy");
  write_safetensors(file, header, data);
}

std::pair<nlohmann::json, std::string> Corpus::read_safetensors(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream all;
  all << in.rdbuf();
  const std::string bytes = all.str();
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[size_t(i)])) << (8 * i);
  return {nlohmann::json::parse(bytes.substr(8, n)), bytes.substr(8 + n)};
}

void Corpus::write_safetensors(const fs::path& file, const nlohmann::json& header, const std::string& data) {
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((uint64_t(text.size()) >> (8 * i)) & 0xff);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << out << text << data;
}

std::vector<std::string> Corpus::generate(const fs::path& model, std::vector<std::string> extra) const {
  std::vector<std::string> args{"generate", "--model", model.string(), "--prompt", "a cat", "--height", "32",
                                "--width",  "32",      "--steps",      "1",        "--max-sequence-length", "16",
                                "--out",    (out_dir() / "out.png").string()};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

void Corpus::add(Case c) { cases_.push_back(std::move(c)); }

}  // namespace kiln::corpus

int main(int argc, char** argv) {
  using namespace kiln::corpus;
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s KILN FIXTURES_DIR [--filter TEXT] [--timeout SECONDS] [--fast-timeout SECONDS]\n",
                 argv[0]);
    return 2;
  }
  const std::string kiln = argv[1];
  std::string filter;
  int timeout = 120, fast_timeout = 10;  // fast: the cases of values bounded before any work (Case::fast)
  for (int i = 3; i + 1 < argc; i += 2) {
    if (std::string(argv[i]) == "--filter") filter = argv[i + 1];
    if (std::string(argv[i]) == "--timeout") timeout = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--fast-timeout") fast_timeout = std::atoi(argv[i + 1]);
  }
  const fs::path scratch = fs::temp_directory_path() / ("kiln_bad_input_" + std::to_string(::getpid()));
  fs::remove_all(scratch);
  Corpus corpus(scratch, argv[2]);
  add_output_cases(corpus);
  add_hub_cache_cases(corpus);
  add_value_cases(corpus);
  add_checkpoint_cases(corpus);
  add_size_cases(corpus);
  add_cli_cases(corpus);
  add_bound_cases(corpus);
  add_input_cases(corpus);

  // Reports that mean a crash or a sanitizer finding, whatever the exit code.
  const char* never[] = {"internal error", "AddressSanitizer", "LeakSanitizer", "runtime error:", "Segmentation fault",
                         "std::bad_alloc", "terminate called"};
  int passed = 0, failed = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Case& c : corpus.cases()) {
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    std::vector<fs::path> watch = c.watch;
    if (watch.empty()) watch = {corpus.out_dir(), corpus.models_dir()};
    std::vector<std::map<std::string, std::string>> before;
    for (const fs::path& w : watch) before.push_back(snapshot(w));
    const int limit = c.fast ? std::min(timeout, fast_timeout) : timeout;
    const Run r = run(kiln, c, limit);
    std::string why;
    if (r.timed_out)
      why += " timed out after " + std::to_string(limit) +
             (c.fast ? " s (a bound checked before any work must fail at once);" : " s (a hang);");
    else if (r.exit_code != c.exit_code)
      why += " exit code " + std::to_string(r.exit_code) + ", expected " + std::to_string(c.exit_code) + ";";
    for (const std::string& e : c.expect)
      if (r.output.find(e) == std::string::npos) why += " no '" + e + "' in the output;";
    for (const std::string& f : c.forbid)
      if (r.output.find(f) != std::string::npos) why += " '" + f + "' in the output;";
    for (const char* f : never)
      if (r.output.find(f) != std::string::npos) why += std::string(" '") + f + "' in the output;";
    for (size_t i = 0; i < watch.size(); ++i) {
      const std::string d = tree_diff(before[i], snapshot(watch[i]));
      if (!d.empty()) why.append(" ").append(watch[i].string()).append(":").append(d);
    }
    if (why.empty()) {
      ++passed;
      std::printf("ok   %-44s %6.2f s\n", c.name.c_str(), r.seconds);
    } else {
      ++failed;
      std::string out = r.output.size() > 2000 ? r.output.substr(r.output.size() - 2000) : r.output;
      std::printf("FAIL %-44s %6.2f s:%s\n  kiln", c.name.c_str(), r.seconds, why.c_str());
      for (const std::string& a : c.args) std::printf(" %s", a.c_str());
      std::printf("\n  output: %s\n", out.c_str());
    }
    std::fflush(stdout);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::error_code ec;
  fs::remove_all(scratch, ec);
  std::printf("bad-input corpus (%s): %.1f s\n", kiln.c_str(), seconds);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 && passed > 0 ? 0 : 1;
}
