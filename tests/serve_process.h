// `kiln serve` as a test starts it: the real process on an ephemeral loopback port, and the
// small client helpers the server's test files share (tests/test_serve*.cc).
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spawn_util.h"
#include "tokenizers/precompiled_charsmap.h"

namespace kiln::serve_test {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;

// One `kiln serve` process (the bundled checkpoint unless the flags say otherwise), started
// by `launcher` when given (mpirun ...); its stderr goes to a file, where the port it bound is read.
class ServerProcess {
 public:
  explicit ServerProcess(const fs::path& dir, std::vector<std::string> flags = {},
                         std::vector<std::string> launcher = {})
      : log_(dir / "serve.log") {
    std::vector<std::string> argv = std::move(launcher);
    for (const char* a : {KILN_CLI_PATH, "serve", "--port", "0"}) argv.push_back(a);
    argv.insert(argv.end(), flags.begin(), flags.end());
    pid_ = test::spawn_logged(argv, log_);
    EXPECT_GT(pid_, 0);
    const std::regex serving(R"(serving .* on http://[^:]+:(\d+))");
    for (int i = 0; i < 600 && port_ == 0; ++i) {  // up to a minute for load and warm-up
      std::smatch m;
      const std::string log = test::read_text_file(log_);
      if (std::regex_search(log, m, serving)) port_ = std::stoi(m[1]);
      else if (exited()) break;
      else std::this_thread::sleep_for(100ms);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited()) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string log() const { return test::read_text_file(log_); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120s);
    return c;
  }
  // SIGTERM (or `signal`), then the exit status (-1 when it did not exit normally within a minute).
  int terminate(int signal = SIGTERM) {
    ::kill(pid_, signal);
    return wait_exit();
  }
  int wait_exit() {
    for (int i = 0; i < 600; ++i) {
      if (exited()) return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
      std::this_thread::sleep_for(100ms);
    }
    return -1;
  }

 private:
  bool exited() {
    if (done_) return true;
    if (::waitpid(pid_, &status_, WNOHANG) == pid_) done_ = true;
    return done_;
  }
  fs::path log_;
  pid_t pid_ = -1;
  int port_ = 0, status_ = 0;
  bool done_ = false;
};


inline std::string b64_png(const json& answer, size_t i = 0) {
  return tokenizers::PrecompiledCharsmap::base64_decode(answer.at("data").at(i).at("b64_json").get<std::string>(), "b64_json");
}

inline json post_json(httplib::Client& c, const std::string& path, const json& body, int expected_status) {
  const auto res = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(res) << path;
  if (!res) return nullptr;
  EXPECT_EQ(res->status, expected_status) << path << " " << body.dump() << " -> " << res->body;
  return json::parse(res->body, nullptr, false);
}

// Polls GET /v1/jobs/{id} until `done(status)` holds (or ~60 s pass).
inline json wait_status(httplib::Client& c, const std::string& id, const std::function<bool(const json&)>& done) {
  json status;
  for (int i = 0; i < 6000; ++i) {
    const auto res = c.Get(("/v1/jobs/" + id).c_str());
    if (!res) break;
    status = json::parse(res->body);
    if (done(status)) return status;
    std::this_thread::sleep_for(10ms);
  }
  ADD_FAILURE() << "job " << id << " never reached the state; last: " << status.dump();
  return status;
}

// A counter or gauge of GET /metrics (its name with labels, e.g. kiln_jobs_total{outcome="done"}).
inline int metric(httplib::Client& c, const std::string& name) {
  const std::string m = c.Get("/metrics")->body;
  std::smatch match;
  EXPECT_TRUE(std::regex_search(m, match, std::regex(std::regex_replace(name, std::regex(R"([{}])"), R"(\$&)") +
                                                     R"( (\d+))")))
      << name << " in " << m;
  return match.empty() ? -1 : std::stoi(match[1]);
}

// A TCP connection to the server on 127.0.0.1, or -1.
inline int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& data) {
  for (size_t sent = 0; sent < data.size();) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += size_t(n);
  }
  return true;
}

// Everything the peer sends until it closes (or `limit` passes without a byte).
inline std::string read_until_closed(int fd, std::chrono::seconds limit = 10s) {
  timeval wait{limit.count(), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, size_t(n));
  return got;
}

}  // namespace kiln::serve_test
