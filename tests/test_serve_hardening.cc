// `kiln serve` against clients that try to starve or abuse it, over real loopback sockets: slow
// senders and event followers never hold up /health or a generation, oversized bodies and header
// floods are refused while receiving (with the server's memory flat), a second server cannot take
// a bound port, web pages elsewhere cannot use a server that has no API key, and the connection
// limits evict the oldest unfinished request first. Every loop here is bounded in count and time.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <optional>

#include "io/png.h"
#include "serve_process.h"
#include "test_util.h"

namespace kiln {
namespace {

using namespace serve_test;

// The process's resident memory (VmRSS), in bytes.
size_t resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return size_t(std::stoull(line.substr(6))) * 1024;
  return 0;
}

class ServeHardening : public testing::Test {
 protected:
  fs::path dir() const { return tmp_.path(); }
  test::ScopedTempDir tmp_{"serve_hardening_" +
                           std::string(testing::UnitTest::GetInstance()->current_test_info()->name())};
};

// 70 followers of a job's events, their streams read (and dropped) by one thread.
class Followers {
 public:
  Followers(int port, const std::string& id, int count) {
    const std::string request = "GET /v1/jobs/" + id + "/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    for (int i = 0; i < count; ++i) {
      const int fd = connect_loopback(port);
      EXPECT_GE(fd, 0);
      EXPECT_TRUE(send_all(fd, request));
      fds_.push_back(fd);
    }
    reader_ = std::thread([this] {
      std::vector<pollfd> p;
      for (int fd : fds_) p.push_back({fd, POLLIN, 0});
      char buf[4096];
      while (!stop_) {
        if (::poll(p.data(), p.size(), 100) <= 0) continue;
        for (pollfd& q : p)
          if (q.revents & (POLLIN | POLLHUP)) {
            if (::recv(q.fd, buf, sizeof buf, 0) <= 0) q.fd = -q.fd - 1, ++ended_;  // closed: poll skips it
            else ++reads_;
          }
      }
    });
  }
  ~Followers() {
    stop_ = true;
    reader_.join();
    for (int fd : fds_) ::close(fd);
  }
  int ended() const { return ended_; }
  int reads() const { return reads_; }

 private:
  std::vector<int> fds_;
  std::thread reader_;
  std::atomic<bool> stop_{false};
  std::atomic<int> ended_{0}, reads_{0};
};

// 200 slow clients, each sending one byte of a request every 5 s, and 70 event followers: every
// /health answers within 1 s, a generation completes, and SIGTERM ends the server with 0 within
// 2 s while they are still connected.
TEST_F(ServeHardening, SlowSendersAndEventFollowersStarveNothing) {
  ServerProcess server(dir(), {"--max-steps", "10000", "--on-stop", "cancel"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const std::string first = post_json(c, "/v1/jobs", {{"prompt", "long"}, {"steps", 10000}}, 202)["id"];
  wait_status(c, first, [](const json& s) { return s["state"] == "running"; });
  std::optional<Followers> followers(std::in_place, server.port(), first, 70);

  std::vector<int> slow;
  for (int i = 0; i < 200; ++i) slow.push_back(connect_loopback(server.port()));
  std::atomic<bool> stop_slow{false};
  std::thread slow_sender([&] {
    const std::string line = "GET /health HTTP/1.1\r\n";
    for (size_t byte = 0; byte < line.size() && !stop_slow; ++byte) {
      for (int fd : slow) ::send(fd, &line[byte], 1, MSG_NOSIGNAL);
      for (int i = 0; i < 50 && !stop_slow; ++i) std::this_thread::sleep_for(100ms);  // 5 s
    }
  });

  // /health, each on a new connection, for 11 s: two rounds of the slow clients' bytes.
  const auto start = std::chrono::steady_clock::now();
  int answered = 0;
  auto slowest = 0ms;
  while (std::chrono::steady_clock::now() - start < 11s) {
    httplib::Client h("127.0.0.1", server.port());
    h.set_read_timeout(5s);
    const auto t0 = std::chrono::steady_clock::now();
    const auto res = h.Get("/health");
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    ASSERT_TRUE(res) << "after " << answered << " answers";
    EXPECT_EQ(res->status, 200);
    slowest = std::max(slowest, took);
    ++answered;
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_LT(slowest, 1000ms) << "the slowest /health of " << answered;
  std::printf("%d /health answers among 200 slow clients and 70 followers, the slowest in %lld ms\n", answered,
              static_cast<long long>(slowest.count()));
  EXPECT_GT(followers->reads(), 70) << "the followers received the running job's steps";
  EXPECT_EQ(followers->ended(), 0);

  // A generation, queued behind the long job, completes once that job is cancelled.
  std::optional<httplib::Result> generated;
  std::thread generation([&] {
    httplib::Client g = server.client();
    generated.emplace(g.Post("/v1/images/generations", R"({"prompt": "a fox", "steps": 2})", "application/json"));
  });
  for (int i = 0; i < 500 && metric(c, "kiln_queue_depth") != 1; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(c.Delete(("/v1/jobs/" + first).c_str())->status, 200);
  generation.join();
  ASSERT_TRUE(generated && *generated);
  EXPECT_EQ((*generated)->status, 200) << (*generated)->body;
  for (int i = 0; i < 200 && followers->ended() < 70; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(followers->ended(), 70) << "each follower's stream ends with the job";

  // Stopping with 70 followers of a running job and the slow clients connected.
  const std::string second = post_json(c, "/v1/jobs", {{"prompt", "long"}, {"steps", 10000}}, 202)["id"];
  wait_status(c, second, [](const json& s) { return s["state"] == "running"; });
  followers.emplace(server.port(), second, 70);
  for (int i = 0; i < 500 && followers->reads() < 70; ++i) std::this_thread::sleep_for(10ms);
  const int open = metric(c, "kiln_http_connections");
  EXPECT_GE(open, 200) << "slow clients and followers are held (some slow ones evicted by the per-client limit)";
  const auto stop_start = std::chrono::steady_clock::now();
  EXPECT_EQ(server.terminate(), 0) << server.log();
  const auto stop_took = std::chrono::steady_clock::now() - stop_start;
  EXPECT_LT(stop_took, 2s);
  std::printf("SIGTERM with %d connections open: exited in %lld ms\n", open,
              static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(stop_took).count()));
  stop_slow = true;
  slow_sender.join();
  for (int fd : slow) ::close(fd);
}

// A chunked body over --max-body is answered 413 while it arrives, a declared one at once, and
// 100 MB of headers 431; the server's memory does not follow what clients send.
TEST_F(ServeHardening, OversizedBodiesAndHeaderFloodsAreRefusedWhileReceiving) {
  ServerProcess server(dir());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  ASSERT_EQ(c.Get("/health")->status, 200);
  const size_t rss_before = resident_bytes(server.pid());
  ASSERT_GT(rss_before, 0u);

  // Sends `head`, then `piece` up to `count` times (until the server stops reading), while another
  // thread reads the answer.
  const auto flood = [&](const std::string& head, const std::string& piece, size_t count) {
    const int fd = connect_loopback(server.port());
    EXPECT_GE(fd, 0);
    timeval wait{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wait, sizeof wait);
    std::string answer;
    std::thread reader([&] { answer = read_until_closed(fd, 20s); });
    size_t sent = 0;
    if (send_all(fd, head))
      for (; sent < count && send_all(fd, piece); ++sent) {
      }
    reader.join();
    ::close(fd);
    return std::pair{answer, sent};
  };

  const std::string mib(1 << 20, 'x');
  const std::string chunk = "100000\r\n" + mib + "\r\n";  // 1 MiB (hex 100000)
  const auto [chunked, chunks_sent] = flood(
      "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
      chunk, 256);
  EXPECT_EQ(chunked.rfind("HTTP/1.1 413", 0), 0u) << chunked.substr(0, 200);
  EXPECT_NE(chunked.find("\"param\":\"body\""), std::string::npos) << chunked;
  EXPECT_LT(chunks_sent, 256u) << "the server read the whole 256 MiB";

  const int declared = connect_loopback(server.port());
  ASSERT_TRUE(send_all(declared,
                       "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       "Content-Length: 268435456\r\n\r\n"));
  const std::string declared_answer = read_until_closed(declared);
  ::close(declared);
  EXPECT_EQ(declared_answer.rfind("HTTP/1.1 413", 0), 0u) << declared_answer;

  std::string lines;
  while (lines.size() < (1 << 20)) lines += "X-Flood: " + std::string(990, 'a') + "\r\n";
  const auto [headers, batches_sent] = flood("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n", lines, 100);
  EXPECT_TRUE(headers.empty() || headers.rfind("HTTP/1.1 431", 0) == 0) << headers.substr(0, 200);
  EXPECT_LT(batches_sent, 100u) << "the server read 100 MB of headers";

  const size_t rss_after = resident_bytes(server.pid());
  EXPECT_LT(rss_after, rss_before + (16 << 20)) << "RSS " << rss_before << " -> " << rss_after;
  std::printf("sent %zu of 256 MiB chunks and %zu of 100 MiB of headers; server RSS %zu -> %zu KiB\n", chunks_sent,
              batches_sent, rss_before >> 10, rss_after >> 10);
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(metric(c, "kiln_jobs_total{outcome=\"submitted\"}"), 0);
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

// SO_REUSEADDR only: a second server on a bound port fails with one line (no SO_REUSEPORT
// splitting the connections between the two).
TEST_F(ServeHardening, ASecondServerOnABoundPortFails) {
  ServerProcess first(dir());
  ASSERT_GT(first.port(), 0) << first.log();
  const fs::path second_dir = dir() / "second";
  fs::create_directories(second_dir);
  ServerProcess second(second_dir, {"--port", std::to_string(first.port())});
  EXPECT_EQ(second.wait_exit(), 1) << second.log();
  EXPECT_NE(second.log().find("cannot listen on 127.0.0.1:" + std::to_string(first.port()) +
                              ": the port is in use (another server listens there)"),
            std::string::npos)
      << second.log();
  EXPECT_EQ(first.terminate(), 0) << first.log();
}

// Without --api-key: a POST that is not JSON, another site's Origin and a foreign Host are 403;
// the page cannot be framed, runs no inline script and starts nothing from a GET. A name given
// with --allowed-hosts is answered.
TEST_F(ServeHardening, WebPagesElsewhereCannotUseAServerWithoutAKey) {
  ServerProcess server(dir(), {"--allowed-hosts", "kiln.lan"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const std::string port = std::to_string(server.port());
  const std::string body = R"({"prompt": "x", "steps": 1})";
  const auto refused = [](const httplib::Result& res, const std::string& header) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 403) << res->body;
    EXPECT_EQ(json::parse(res->body)["error"]["param"], header) << res->body;
  };
  refused(c.Post("/v1/jobs", body, "text/plain"), "Content-Type");
  refused(c.Post("/v1/images/generations", body, "application/x-www-form-urlencoded"), "Content-Type");
  refused(c.Post("/v1/jobs", {{"Origin", "http://evil.example"}}, body, "application/json"), "Origin");
  refused(c.Post("/v1/jobs", {{"Origin", "null"}}, body, "application/json"), "Origin");
  refused(c.Get("/metrics", {{"Host", "evil.example:" + port}}), "Host");
  refused(c.Get("/v1/jobs/0123456789abcdef", {{"Host", "rebound.example"}}), "Host");
  EXPECT_EQ(c.Get("/metrics", {{"Host", "kiln.lan:" + port}})->status, 200);
  // The page's own request.
  const auto own = c.Post("/v1/jobs", {{"Origin", "http://127.0.0.1:" + port}}, body, "application/json");
  ASSERT_TRUE(own);
  EXPECT_EQ(own->status, 202) << own->body;

  const auto page = c.Get("/?prompt=a%20fox&submit=1");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_EQ(page->get_header_value("X-Frame-Options"), "DENY");
  const std::string csp = page->get_header_value("Content-Security-Policy");
  EXPECT_NE(csp.find("frame-ancestors 'none'"), std::string::npos) << csp;
  EXPECT_NE(csp.find("script-src 'self'"), std::string::npos) << csp;
  EXPECT_EQ(csp.find("'unsafe-inline'"), csp.find("style-src 'unsafe-inline'") + 10) << "only styles inline: " << csp;
  EXPECT_EQ(csp.find("'unsafe-inline'"), csp.rfind("'unsafe-inline'")) << csp;
  EXPECT_EQ(page->body.find("<script>"), std::string::npos) << "an inline script the policy would block";
  EXPECT_NE(page->body.find("<script src=\"/kiln.js\"></script>"), std::string::npos);
  const auto script = c.Get("/kiln.js");
  ASSERT_TRUE(script);
  EXPECT_EQ(script->status, 200);
  EXPECT_EQ(script->body.find("requestSubmit"), std::string::npos) << "a link must not start a job";
  EXPECT_EQ(metric(c, "kiln_jobs_total{outcome=\"submitted\"}"), 1) << "only the page's own POST made a job";
  EXPECT_EQ(server.terminate(), 0) << server.log();

  // With a key the key is the check: a client that holds it may send any type.
  ServerProcess keyed(dir(), {"--api-key", "k3y"});
  ASSERT_GT(keyed.port(), 0) << keyed.log();
  httplib::Client k = keyed.client();
  const auto with_key = k.Post("/v1/jobs", {{"Authorization", "Bearer k3y"}}, body, "text/plain");
  ASSERT_TRUE(with_key);
  EXPECT_EQ(with_key->status, 202) << with_key->body;
  EXPECT_EQ(keyed.terminate(), 0) << keyed.log();
}

// Over --max-client-connections, a new connection closes that client's oldest connection that has
// not sent its request; the new request is answered.
TEST_F(ServeHardening, ConnectionLimitsEvictTheOldestUnfinishedRequest) {
  ServerProcess server(dir(), {"--max-client-connections", "8"});
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(connect_loopback(server.port()));
    std::this_thread::sleep_for(20ms);  // accepted in this order
  }
  std::this_thread::sleep_for(200ms);
  httplib::Client c = server.client();
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(read_until_closed(idle[0], 5s), "") << "the oldest idle connection is closed";
  EXPECT_GE(metric(c, "kiln_http_connections_total{outcome=\"evicted\"}"), 1);
  for (int fd : idle) ::close(fd);
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

// Served images carry the model's name, never the server's paths; a flag beyond its range is
// refused before it is narrowed.
TEST_F(ServeHardening, ServedImagesAndFlagsHoldNoServerPathsOrWrappedValues) {
  ServerProcess server(dir());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const json answer = post_json(c, "/v1/images/generations", {{"prompt", "a fox"}, {"steps", 1}}, 200);
  const fs::path png = dir() / "served.png";
  std::ofstream(png, std::ios::binary) << b64_png(answer);
  const io::PngImage image = io::read_png(png);
  bool has_model = false;
  for (const auto& [key, value] : image.text) {
    EXPECT_EQ(value.find(KILN_SOURCE_DIR), std::string::npos) << key << ": " << value;
    if (key == "model") {
      has_model = true;
      EXPECT_EQ(value, "kiln-bundled-flux1-tiny");
    }
  }
  EXPECT_TRUE(has_model);
  EXPECT_EQ(server.terminate(), 0) << server.log();

  for (const auto& [flag, value] : {std::pair{"--port", "4294975157"}, std::pair{"--timeout", "1099511627776"}}) {
    ServerProcess bad(dir(), {flag, value});
    EXPECT_EQ(bad.wait_exit(), 1) << flag;
    EXPECT_NE(bad.log().find(std::string(flag) + " must be in ["), std::string::npos) << bad.log();
  }
}

}  // namespace
}  // namespace kiln
