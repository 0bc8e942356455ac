// An HTTP/1.1 server on one event-loop thread (Boost.Asio and Boost.Beast): what `kiln serve`
// answers through, knowing nothing of jobs or images.
//
// A thread-per-connection server is starved by clients that send a byte now and then, and by
// clients that wait (for an image, for events). Here a connection costs a socket and its buffers,
// not a thread, and every limit is enforced while receiving:
// - a request (headers and body) must arrive whole within `request_timeout` from its first byte's
//   wait, not per `recv`; a response must be taken by the client within it too;
// - headers over `max_header_bytes` are answered 431, a body over `max_body_bytes` 413 as soon as
//   its Content-Length or its chunks pass the limit, without reading the rest;
// - at most `max_connections` connections, `max_client_connections` of them from one address:
//   a new connection over either limit closes the oldest connection of that client (or of all)
//   that is still receiving its request, so a slow client can only crowd out itself; waiting and
//   streaming connections are never evicted;
// - `stop()` closes idle and half-read connections at once; `drain()` ends the loop once the
//   answers being sent are sent (or `request_timeout` passes).
// Handlers run on the loop's thread and must not block: a handler that cannot answer yet returns
// a Deferred or a Stream, which the loop polls after every `notify()` (from any thread).
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln::server {

struct HttpLimits {
  size_t max_connections = 1024;
  size_t max_client_connections = 256;  // per client address
  size_t max_header_bytes = 64 << 10;   // the request line and headers together
  size_t max_body_bytes = 1 << 20;
  std::chrono::seconds request_timeout{30};
  std::chrono::seconds keep_alive{5};  // an idle connection between requests
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // as sent: path and query
  std::string path;    // the target before '?', percent-decoded
  std::vector<std::pair<std::string, std::string>> query;    // decoded name=value pairs
  std::vector<std::pair<std::string, std::string>> headers;  // as received
  std::string body;
  std::string client;  // the peer's address

  // The first header of that name (case-insensitive), "" when absent.
  std::string header(const std::string& name) const;
  bool has_header(const std::string& name) const;
  std::optional<std::string> param(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  void set_header(const std::string& name, const std::string& value);
  void set_content(std::string content, const std::string& content_type);
};

// A handler's answer: a response now, a response later (`poll` returns it once it can, polled on
// every notify), or a chunked stream (`next` appends what is ready to `out` and returns false
// once the stream has ended; polled on every notify and at least every `heartbeat`).
struct HttpReply {
  struct Deferred {
    std::function<std::optional<HttpResponse>()> poll;
  };
  struct Stream {
    HttpResponse head;  // status and headers; its body is ignored
    std::function<bool(std::string& out)> next;
  };
  HttpReply(HttpResponse now) : response(std::move(now)) {}  // NOLINT: a response converts
  HttpReply(Deferred later) : deferred(std::move(later)) {}  // NOLINT
  HttpReply(Stream s) : stream(std::move(s)) {}              // NOLINT

  std::optional<HttpResponse> response;
  std::optional<Deferred> deferred;
  std::optional<Stream> stream;
};

// The handlers: `admit` sees a request's headers (its body not yet read) and may answer it at
// once (auth, origin, a route that takes no body: the body is then never read); `handle` answers
// the whole request. Both run on the loop's thread.
struct HttpHandlers {
  std::function<std::optional<HttpResponse>(const HttpRequest& head)> admit;
  std::function<HttpReply(const HttpRequest& request)> handle;
  // The answer to a request the server refuses itself (400, 413, 431, 500): status and a message.
  std::function<HttpResponse(int status, const std::string& message)> error;
};

struct HttpCounters {
  size_t open = 0;         // connections now
  uint64_t accepted = 0;   // connections ever
  uint64_t evicted = 0;    // closed to admit a newer one (the limits above)
  uint64_t refused = 0;    // closed at once: over a limit with nothing to evict
  uint64_t timed_out = 0;  // requests or answers past request_timeout
};

class HttpServer {
 public:
  HttpServer(HttpLimits limits, HttpHandlers handlers);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds `host` (a name or address) and `port` (0: any free port) with SO_REUSEADDR only, so a
  // port another server holds fails here. Returns the port bound; throws kiln::Error naming the
  // address otherwise.
  int bind(const std::string& host, int port);
  // Runs the loop on the calling thread until drain() has finished.
  void run();

  // From any thread: deferred answers and streams are polled again.
  void notify();
  // From any thread: idle and half-read connections are closed now, and so is every connection
  // that later finishes its answer or goes idle; new connections are still accepted (and answered,
  // e.g. 503), so a client learns the server is stopping.
  void stop();
  // From any thread, after stop(): stops accepting, and ends run() once every answer in progress
  // has been sent (at most request_timeout from now); waiting connections are closed.
  void drain();

  HttpCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::server
