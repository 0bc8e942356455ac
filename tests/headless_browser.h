// Debian's chromium, headless, driven over its DevTools pipe (--remote-debugging-pipe: commands
// in on descriptor 3, answers out on 4, each a JSON message ended by a NUL): a test opens a page,
// evaluates script in it (clicks a button, reads the DOM) as a person would act on it.
#pragma once
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace kiln::test {

class HeadlessBrowser {
 public:
  explicit HeadlessBrowser(const std::filesystem::path& profile) {
    int to_browser[2], from_browser[2];
    if (::pipe(to_browser) != 0 || ::pipe(from_browser) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      // Moved above 4 first, so neither dup2 below overwrites the other's source.
      const int in = ::fcntl(to_browser[0], F_DUPFD, 10), out = ::fcntl(from_browser[1], F_DUPFD, 10);
      ::dup2(in, 3);
      ::dup2(out, 4);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      const std::string data_dir = "--user-data-dir=" + profile.string();
      ::execlp("chromium", "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
               data_dir.c_str(), "about:blank", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(to_browser[0]);
    ::close(from_browser[1]);
    to_ = to_browser[1];
    from_ = from_browser[0];
  }
  ~HeadlessBrowser() {
    if (pid_ > 0) {
      command("Browser.close", {}, "", std::chrono::seconds(5));
      ::close(to_);
      ::close(from_);
      for (int i = 0; i < 50 && ::waitpid(pid_, nullptr, WNOHANG) == 0; ++i) ::usleep(100000);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return pid_ > 0; }

  // Opens `url` in a new tab and attaches to it: later evaluate() calls run there. False on failure.
  bool open(const std::string& url) {
    const nlohmann::json target = command("Target.createTarget", {{"url", url}});
    if (!target.contains("targetId")) return false;
    const nlohmann::json session =
        command("Target.attachToTarget", {{"targetId", target["targetId"]}, {"flatten", true}});
    if (!session.contains("sessionId")) return false;
    session_ = session["sessionId"];
    return true;
  }

  // The value of a JavaScript expression in the open tab (null when it threw or timed out).
  nlohmann::json evaluate(const std::string& expression) {
    const nlohmann::json r =
        command("Runtime.evaluate", {{"expression", expression}, {"returnByValue", true}, {"awaitPromise", true}}, session_);
    if (!r.contains("result") || r.contains("exceptionDetails")) return nullptr;
    return r["result"].value("value", nlohmann::json());
  }

  // Sends a DevTools command and returns its result ({} on an error or after `limit`).
  nlohmann::json command(const std::string& method, const nlohmann::json& params, const std::string& session = "",
                         std::chrono::seconds limit = std::chrono::seconds(30)) {
    nlohmann::json message{{"id", ++id_}, {"method", method}, {"params", params.is_null() ? nlohmann::json::object() : params}};
    if (!session.empty()) message["sessionId"] = session;
    const std::string text = message.dump() + std::string(1, '\0');
    if (::write(to_, text.data(), text.size()) != ssize_t(text.size())) return {};
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (;;) {  // events arrive between answers: skipped
      const size_t end = pending_.find('\0');
      if (end != std::string::npos) {
        const nlohmann::json answer = nlohmann::json::parse(pending_.substr(0, end), nullptr, false);
        pending_.erase(0, end + 1);
        if (answer.is_object() && answer.value("id", -1) == id_) return answer.value("result", nlohmann::json::object());
        continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{from_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, int(left.count())) <= 0) return {};
      char buf[65536];
      const ssize_t n = ::read(from_, buf, sizeof buf);
      if (n <= 0) return {};
      pending_.append(buf, size_t(n));
    }
  }

 private:
  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  int id_ = 0;
  std::string session_, pending_;
};

}  // namespace kiln::test
