#include "server/http_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <map>
#include <mutex>
#include <strings.h>
#include <unordered_map>

#include "core/error.h"

namespace kiln::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

bool same_name(const std::string& a, const std::string& b) {
  return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A query component ("+" is a space) or a path: "%XY" is a byte; a malformed escape stays as it is.
std::string decode_component(std::string_view s, bool plus_is_space = true) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+' && plus_is_space) {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
      out += char(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> parse_query(std::string_view query) {
  std::vector<std::pair<std::string, std::string>> pairs;
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view part = query.substr(0, amp);
    if (!part.empty()) {
      const size_t eq = part.find('=');
      pairs.emplace_back(decode_component(part.substr(0, eq)),
                         eq == std::string_view::npos ? "" : decode_component(part.substr(eq + 1)));
    }
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return pairs;
}

// What a request the parser refused is answered: 0 closes the connection without an answer (the
// client left, or is too slow to deserve one).
int refusal_status(const beast::error_code& ec) {
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) return 431;
  if (ec == http::error::body_limit) return 413;
  // Past the deadline the socket is closed already (as busy servers do, no 408 is sent to a
  // client too slow to send its request).
  if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == net::error::eof ||
      ec == net::error::connection_reset || ec == net::error::operation_aborted || ec == net::error::broken_pipe ||
      ec == http::error::partial_message)
    return 0;
  return 400;
}

std::string refusal_message(int status, const HttpLimits& limits) {
  if (status == 431)
    return "the request's headers are larger than this server takes (" + std::to_string(limits.max_header_bytes) +
           " bytes)";
  if (status == 413)
    return "the request body is larger than this server takes (" + std::to_string(limits.max_body_bytes) +
           " bytes)";
  return "the request could not be read as HTTP/1.1";
}

}  // namespace

std::string HttpRequest::header(const std::string& name) const {
  for (const auto& [n, v] : headers)
    if (same_name(n, name)) return v;
  return "";
}

bool HttpRequest::has_header(const std::string& name) const {
  return std::any_of(headers.begin(), headers.end(), [&](const auto& h) { return same_name(h.first, name); });
}

std::optional<std::string> HttpRequest::param(const std::string& name) const {
  for (const auto& [n, v] : query)
    if (n == name) return v;
  return std::nullopt;
}

void HttpResponse::set_header(const std::string& name, const std::string& value) {
  for (auto& [n, v] : headers)
    if (same_name(n, name)) {
      v = value;
      return;
    }
  headers.emplace_back(name, value);
}

void HttpResponse::set_content(std::string content, const std::string& content_type) {
  body = std::move(content);
  set_header("Content-Type", content_type);
}

struct HttpServer::Impl {
  struct Connection;

  Impl(HttpLimits l, HttpHandlers h) : limits(l), handlers(std::move(h)), acceptor(ioc), heartbeat(ioc) {}

  HttpLimits limits;
  HttpHandlers handlers;
  net::io_context ioc{1};
  tcp::acceptor acceptor;
  net::steady_timer heartbeat;
  std::unique_ptr<net::steady_timer> drain_deadline;
  std::map<uint64_t, std::shared_ptr<Connection>> connections;
  std::unordered_map<std::string, size_t> per_client;
  uint64_t next_id = 0;
  bool stopping = false, draining = false;
  std::atomic<bool> sweep_pending{false};
  mutable std::mutex counters_mu;  // counters are read from other threads
  HttpCounters counters;

  void accept();
  void admit(tcp::socket socket);
  void remove(Connection& c);
  void sweep();
  void tick();
  void close_receiving();
  void finish_if_drained();
};

struct HttpServer::Impl::Connection : std::enable_shared_from_this<Connection> {
  enum class State { kReceiving, kWaiting, kStreaming, kSending, kLingering, kClosed };

  Connection(Impl& s, tcp::socket socket, std::string peer, uint64_t n)
      : server(s), stream(std::move(socket)), buffer(s.limits.max_header_bytes + 16384), client(std::move(peer)), id(n) {}

  Impl& server;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  std::optional<http::request_parser<http::string_body>> parser;
  std::string client;
  uint64_t id;
  State state = State::kReceiving;
  Clock::time_point since = Clock::now();  // when the current state began: eviction takes the oldest
  bool keep_alive = false;
  bool body_unread = false;  // answered from the headers alone: the body never read, so no next request
  std::optional<HttpReply::Deferred> deferred;
  std::optional<HttpReply::Stream> streaming;
  std::unique_ptr<http::response<http::string_body>> response;
  std::unique_ptr<http::response<http::empty_body>> stream_head;
  std::unique_ptr<http::response_serializer<http::empty_body>> stream_serializer;
  std::string chunk;
  bool chunk_in_flight = false, stream_ended = false;  // chunk: written, or waiting to be

  // What eviction and stop() may close: a connection whose request has not arrived (or whose
  // refused body is being dropped).
  void count_timeout(const beast::error_code& ec) {
    if (ec != beast::error::timeout) return;
    std::lock_guard lock(server.counters_mu);
    ++server.counters.timed_out;
  }

  bool receiving() const { return state == State::kReceiving || state == State::kLingering; }

  void close() {
    if (state == State::kClosed) return;
    state = State::kClosed;
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream.close();
    deferred.reset();
    streaming.reset();
    server.remove(*this);
  }

  void set_state(State s) {
    state = s;
    since = Clock::now();
  }

  // The next request: the first one has request_timeout from the accept; later ones wait up to
  // keep_alive for their first byte, then have request_timeout.
  void next_request(bool first) {
    set_state(State::kReceiving);
    if (server.stopping && !first) return close();
    if (first || buffer.size() > 0) return read_header();
    stream.expires_after(server.limits.keep_alive);
    stream.async_read_some(buffer.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (self->state == State::kClosed) return;
      if (ec) return self->close();
      self->buffer.commit(n);
      self->read_header();
    });
  }

  void read_header() {
    parser.emplace();
    parser->header_limit(std::uint32_t(std::min<size_t>(server.limits.max_header_bytes, UINT32_MAX)));
    parser->body_limit(server.limits.max_body_bytes);
    stream.expires_after(server.limits.request_timeout);
    http::async_read_header(stream, buffer, *parser, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (self->state == State::kClosed) return;
      if (ec) return self->refuse(ec);
      self->on_header();
    });
  }

  HttpRequest head() const {
    const auto& m = parser->get();
    HttpRequest r;
    r.method = std::string(m.method_string());
    r.target = std::string(m.target());
    const size_t q = r.target.find('?');
    r.path = decode_component(std::string_view(r.target).substr(0, q), false);
    if (q != std::string::npos) r.query = parse_query(std::string_view(r.target).substr(q + 1));
    for (const auto& field : m) r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    r.client = client;
    return r;
  }

  void on_header() {
    HttpRequest request = head();
    keep_alive = parser->get().keep_alive();
    if (server.handlers.admit) {
      std::optional<HttpResponse> early;
      try {
        early = server.handlers.admit(request);
      } catch (const std::exception& e) {
        early = internal_error(e);
      }
      if (early) {
        body_unread = !parser->is_done();
        return send(std::move(*early));
      }
    }
    if (parser->is_done()) return on_request(std::move(request));
    // The client waits for this before it sends a large body (curl does).
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    const bool expects_continue = same_name(request.header("Expect"), "100-continue");
    auto read_body = [self = shared_from_this(), request = std::move(request)]() mutable {
      http::async_read(self->stream, self->buffer, *self->parser,
                       [self, request = std::move(request)](beast::error_code ec, size_t) mutable {
                         if (self->state == State::kClosed) return;
                         if (ec) return self->refuse(ec);
                         self->on_request(std::move(request));
                       });
    };
    if (!expects_continue) return read_body();
    net::async_write(stream, net::buffer(kContinue),
                     [self = shared_from_this(), read_body = std::move(read_body)](beast::error_code ec, size_t) mutable {
                       if (self->state == State::kClosed) return;
                       if (ec) return self->close();
                       read_body();
                     });
  }

  // A request the parser refused: answered (431, 413, 400) and closed without reading more.
  void refuse(const beast::error_code& ec) {
    count_timeout(ec);
    const int status = refusal_status(ec);
    if (status == 0 || !server.handlers.error || server.stopping) return close();
    keep_alive = false;
    body_unread = true;
    send(server.handlers.error(status, refusal_message(status, server.limits)));
  }

  // A handler that throws answers 500: the loop serves everyone else on.
  HttpResponse internal_error(const std::exception& e) {
    keep_alive = false;
    return server.handlers.error ? server.handlers.error(500, std::string("internal error: ") + e.what())
                                 : HttpResponse{500, {}, ""};
  }

  void on_request(HttpRequest request) {
    request.body = std::move(parser->get().body());
    std::optional<HttpReply> answer;
    try {
      answer.emplace(server.handlers.handle(request));
    } catch (const std::exception& e) {
      return send(internal_error(e));
    }
    HttpReply& reply = *answer;
    if (reply.response) return send(std::move(*reply.response));
    if (reply.deferred) {
      set_state(State::kWaiting);
      stream.expires_never();
      deferred = std::move(reply.deferred);
      return poll();
    }
    start_stream(std::move(*reply.stream));
  }

  void send(HttpResponse answer) {
    set_state(State::kSending);
    deferred.reset();
    const bool persist = keep_alive && !body_unread && !server.stopping;
    response = std::make_unique<http::response<http::string_body>>(static_cast<http::status>(answer.status), 11);
    response->set(http::field::server, "kiln");
    for (const auto& [name, value] : answer.headers) response->set(name, value);
    response->body() = std::move(answer.body);
    response->keep_alive(persist);
    response->prepare_payload();
    stream.expires_after(server.limits.request_timeout);
    http::async_write(stream, *response, [self = shared_from_this(), persist](beast::error_code ec, size_t) {
      if (self->state == State::kClosed) return;
      self->response.reset();
      self->count_timeout(ec);
      if (!ec && self->body_unread) return self->linger();
      if (ec || !persist) return self->close();
      self->next_request(false);
    });
  }

  // After refusing a request whose body was not read: a client still sending it would get a
  // reset on close, which can destroy the answer it has not read yet. So the answer is followed by
  // a half-close, and what the client still sends is read and dropped: 1 MiB or 2 s at most, then
  // the connection closes (the rest of a huge body is never read).
  void linger() {
    set_state(State::kLingering);
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    stream.expires_after(std::min<Clock::duration>(std::chrono::seconds(2), server.limits.request_timeout));
    discard();
  }

  void discard(size_t dropped = 0) {
    buffer.consume(buffer.size());
    if (dropped >= (1 << 20)) return close();
    stream.async_read_some(buffer.prepare(16384), [self = shared_from_this(), dropped](beast::error_code ec, size_t n) {
      if (self->state == State::kClosed) return;
      if (ec) return self->close();
      self->discard(dropped + n);
    });
  }

  // Called on every sweep: a deferred answer that is ready is sent.
  void poll() {
    try {
      if (state == State::kWaiting && deferred) {
        if (std::optional<HttpResponse> ready = deferred->poll()) send(std::move(*ready));
      } else if (state == State::kStreaming) {
        pump();
      }
    } catch (const std::exception& e) {
      if (state == State::kWaiting) send(internal_error(e));
      else close();  // a stream's head is sent: it can only end
    }
  }

  void start_stream(HttpReply::Stream s) {
    set_state(State::kStreaming);
    streaming = std::move(s);
    stream_head = std::make_unique<http::response<http::empty_body>>(static_cast<http::status>(streaming->head.status), 11);
    stream_head->set(http::field::server, "kiln");
    for (const auto& [name, value] : streaming->head.headers) stream_head->set(name, value);
    stream_head->chunked(true);
    stream_head->keep_alive(false);  // the stream ends the connection
    stream_serializer = std::make_unique<http::response_serializer<http::empty_body>>(*stream_head);
    chunk_in_flight = true;
    stream.expires_after(server.limits.request_timeout);
    http::async_write_header(stream, *stream_serializer, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (self->state == State::kClosed) return;
      self->chunk_in_flight = false;
      if (ec) return self->close();
      self->stream.expires_never();
      self->pump();
    });
  }

  // Writes what the stream has ready, one chunk at a time; a client that does not take a chunk
  // within request_timeout is dropped.
  void pump() {
    if (state != State::kStreaming || chunk_in_flight || !streaming) return;
    if (chunk.empty() && !stream_ended) {
      try {
        stream_ended = !streaming->next(chunk);
      } catch (const std::exception&) {
        return close();  // the head is sent: the stream can only end
      }
    }
    if (chunk.empty() && !stream_ended) return;  // nothing yet: polled again on the next notify
    const bool last = chunk.empty();  // the data written first, then the end of the stream
    chunk_in_flight = true;
    stream.expires_after(server.limits.request_timeout);
    const auto written = [self = shared_from_this(), last](beast::error_code ec, size_t) {
      if (self->state == State::kClosed) return;
      self->chunk_in_flight = false;
      self->chunk.clear();
      self->count_timeout(ec);
      if (ec || last) return self->close();
      self->stream.expires_never();
      self->pump();
    };
    if (last) net::async_write(stream, http::make_chunk_last(), written);
    else net::async_write(stream, http::make_chunk(net::buffer(chunk)), written);
  }
};

void HttpServer::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (or a connection that left before it was taken): try again shortly,
      // without spinning.
      auto retry = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(50));
      retry->async_wait([this, retry](beast::error_code) {
        if (acceptor.is_open()) accept();
      });
      return;
    }
    admit(std::move(socket));
    accept();
  });
}

void HttpServer::Impl::admit(tcp::socket socket) {
  beast::error_code ec;
  const tcp::endpoint peer = socket.remote_endpoint(ec);
  if (ec) return;
  socket.set_option(tcp::no_delay(true), ec);
  const std::string client = peer.address().to_string();
  const bool client_full = per_client[client] >= limits.max_client_connections;
  if (client_full || connections.size() >= limits.max_connections) {
    // Over a limit: the oldest connection still receiving its request (of this client when it is
    // the client's limit) makes room; a client that holds only answered connections cannot.
    std::shared_ptr<Connection> victim;
    for (const auto& [id, c] : connections)
      if (c->receiving() && (!client_full || c->client == client) && (!victim || c->since < victim->since))
        victim = c;
    if (!victim) {
      if (per_client[client] == 0) per_client.erase(client);
      std::lock_guard lock(counters_mu);
      ++counters.refused;
      socket.shutdown(tcp::socket::shutdown_both, ec);
      socket.close(ec);
      return;
    }
    victim->close();
    std::lock_guard lock(counters_mu);
    ++counters.evicted;
  }
  auto c = std::make_shared<Connection>(*this, std::move(socket), client, next_id++);
  connections.emplace(c->id, c);
  ++per_client[client];
  {
    std::lock_guard lock(counters_mu);
    ++counters.accepted;
    counters.open = connections.size();
  }
  c->next_request(true);
}

void HttpServer::Impl::remove(Connection& c) {
  const auto it = connections.find(c.id);
  if (it == connections.end()) return;
  if (--per_client[c.client] == 0) per_client.erase(c.client);
  const std::shared_ptr<Connection> keep = it->second;  // alive until the erase returns
  connections.erase(it);
  {
    std::lock_guard lock(counters_mu);
    counters.open = connections.size();
  }
  finish_if_drained();
}

void HttpServer::Impl::sweep() {
  sweep_pending = false;
  std::vector<std::shared_ptr<Connection>> all;
  all.reserve(connections.size());
  for (const auto& [id, c] : connections) all.push_back(c);
  for (const auto& c : all) c->poll();
}

void HttpServer::Impl::tick() {
  heartbeat.expires_after(std::chrono::seconds(1));
  heartbeat.async_wait([this](beast::error_code ec) {
    if (ec) return;
    sweep();
    tick();
  });
}

void HttpServer::Impl::close_receiving() {
  std::vector<std::shared_ptr<Connection>> idle;
  for (const auto& [id, c] : connections)
    if (c->receiving()) idle.push_back(c);
  for (const auto& c : idle) c->close();
}

void HttpServer::Impl::finish_if_drained() {
  if (draining && connections.empty()) {
    heartbeat.cancel();
    if (drain_deadline) drain_deadline->cancel();
    ioc.stop();
  }
}

HttpServer::HttpServer(HttpLimits limits, HttpHandlers handlers)
    : impl_(std::make_unique<Impl>(limits, std::move(handlers))) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind(const std::string& host, int port) {
  // Each connection is a descriptor: allow as many as the hard limit permits, and no more
  // connections than fit beside the model's files.
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    ::getrlimit(RLIMIT_NOFILE, &files);
  }
  if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur > 128)
    impl_->limits.max_connections = std::min<size_t>(impl_->limits.max_connections, files.rlim_cur - 128);

  beast::error_code ec;
  tcp::resolver resolver(impl_->ioc);
  const auto endpoints = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  KILN_CHECK(!ec, "serve", "cannot listen on ", host, ":", port, ": ", ec.message());
  std::string why = "no address";
  for (const auto& entry : endpoints) {
    tcp::acceptor& a = impl_->acceptor;
    a.open(entry.endpoint().protocol(), ec);
    if (ec) {
      why = ec.message();
      continue;
    }
    // SO_REUSEADDR (a restart binds despite connections in TIME_WAIT) and never SO_REUSEPORT,
    // which would let two servers split one port's connections between them.
    a.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) a.bind(entry.endpoint(), ec);
    if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
    if (!ec) return int(a.local_endpoint().port());
    why = ec == net::error::address_in_use ? "the port is in use (another server listens there)" : ec.message();
    a.close();
  }
  fail("serve", "cannot listen on ", host, ":", port, ": ", why);
}

void HttpServer::run() {
  impl_->accept();
  impl_->tick();
  impl_->ioc.run();
}

void HttpServer::notify() {
  if (impl_->sweep_pending.exchange(true)) return;
  net::post(impl_->ioc, [impl = impl_.get()] { impl->sweep(); });
}

void HttpServer::stop() {
  net::post(impl_->ioc, [impl = impl_.get()] {
    impl->stopping = true;
    impl->close_receiving();
  });
}

void HttpServer::drain() {
  net::post(impl_->ioc, [impl = impl_.get()] {
    impl->stopping = impl->draining = true;
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->sweep();  // answers that became ready are sent before the waiting ones are closed
    std::vector<std::shared_ptr<Impl::Connection>> done;
    for (const auto& [id, c] : impl->connections)
      if (c->receiving() || c->state == Impl::Connection::State::kWaiting) done.push_back(c);
    for (const auto& c : done) c->close();
    impl->drain_deadline = std::make_unique<net::steady_timer>(impl->ioc, impl->limits.request_timeout);
    impl->drain_deadline->async_wait([impl](beast::error_code e) {
      if (e) return;
      std::vector<std::shared_ptr<Impl::Connection>> rest;
      for (const auto& [id, c] : impl->connections) rest.push_back(c);
      for (const auto& c : rest) c->close();
      impl->heartbeat.cancel();
      impl->ioc.stop();
    });
    impl->finish_if_drained();
  });
}

HttpCounters HttpServer::counters() const {
  std::lock_guard lock(impl_->counters_mu);
  return impl_->counters;
}

}  // namespace kiln::server
