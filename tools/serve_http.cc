#include "serve_http.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "devices/runtime.h"
#include "exec/compile.h"
#include "io/base64.h"
#include "serve_page.h"

namespace kiln::cli {

namespace {

using nlohmann::json;

constexpr size_t kConnectionThreads = 64;

// OpenAI's error shape: {"error": {"message", "type", "param"}}; `param` names the field.
void send_error(httplib::Response& res, int status, const std::string& field, const std::string& message) {
  res.status = status;
  const char* type = status == 401 ? "authentication_error"
                     : status == 404 ? "not_found_error"
                     : status == 429 ? "rate_limit_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  // A message quoting the request may hold a cut UTF-8 sequence: replaced, never a throw.
  res.set_content(json{{"error", {{"message", message}, {"type", type}, {"param", field}}}}.dump(
                      -1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// Compares in time that depends on the lengths only, not on where the strings differ.
bool same_secret(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ expected[i % (expected.empty() ? 1 : expected.size())]);
  return diff == 0;
}

// The methods a known path answers ("" for an unknown path): 405 or 404.
std::string allowed_methods(const std::string& path) {
  static const std::regex job(R"(/v1/jobs/[^/]+)"), job_part(R"(/v1/jobs/[^/]+/(events|image))");
  if (path == "/" || path == "/health" || path == "/metrics" || path == "/v1/models") return "GET";
  if (path == "/v1/images/generations" || path == "/v1/jobs") return "POST";
  if (std::regex_match(path, job)) return "GET, DELETE";
  if (std::regex_match(path, job_part)) return "GET";
  return "";
}

// Job ids are 16 lowercase hex digits (server/job_queue.cc); anything else never reaches the
// queue, so no id can name a file or another route.
bool valid_job_id(const std::string& id) {
  return id.size() == 16 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * size_t(::sysconf(_SC_PAGESIZE));
}

std::string metrics_text(const server::QueueStats& s, const ServeSettings& settings) {
  const MemoryStats mem = runtime(Device::cpu()).memory();
  const CompileStats compiled = compile_stats();
  std::ostringstream m;
  m << "# HELP kiln_queue_depth Jobs waiting to start.\n# TYPE kiln_queue_depth gauge\nkiln_queue_depth " << s.queued
    << "\n# HELP kiln_jobs_running Jobs running (0 or 1).\n# TYPE kiln_jobs_running gauge\nkiln_jobs_running "
    << s.running << "\n# HELP kiln_jobs_total Jobs by outcome; rejected: refused with 429 (queue full).\n"
    << "# TYPE kiln_jobs_total counter\n";
  for (const auto& [outcome, n] : {std::pair{"submitted", s.submitted}, std::pair{"done", s.done},
                                   std::pair{"failed", s.failed}, std::pair{"cancelled", s.cancelled},
                                   std::pair{"rejected", s.rejected}})
    m << "kiln_jobs_total{outcome=\"" << outcome << "\"} " << n << "\n";
  m << "# HELP kiln_step_seconds Denoising steps run and their seconds.\n# TYPE kiln_step_seconds summary\n"
    << "kiln_step_seconds_sum " << s.step_seconds << "\nkiln_step_seconds_count " << s.steps << "\n"
    << "# HELP kiln_compile_total Compiled mode: signatures traced, graphs compiled, executables read from the "
       "disk cache.\n# TYPE kiln_compile_total counter\n"
    << "kiln_compile_total{kind=\"traces\"} " << compiled.traces << "\n"
    << "kiln_compile_total{kind=\"compiles\"} " << compiled.compiles << "\n"
    << "kiln_compile_total{kind=\"disk_hits\"} " << compiled.disk_hits << "\n"
    << "# HELP kiln_device_memory_bytes The device allocator's bytes (in_use, peak, capacity; 0 = unlimited).\n"
    << "# TYPE kiln_device_memory_bytes gauge\n"
    << "kiln_device_memory_bytes{kind=\"in_use\"} " << mem.in_use_bytes << "\n"
    << "kiln_device_memory_bytes{kind=\"peak\"} " << mem.peak_bytes << "\n"
    << "kiln_device_memory_bytes{kind=\"capacity\"} " << mem.capacity_bytes << "\n"
    << "# HELP kiln_host_resident_bytes The server process's resident memory.\n"
    << "# TYPE kiln_host_resident_bytes gauge\nkiln_host_resident_bytes " << resident_bytes() << "\n"
    << "# HELP kiln_info The model served.\n# TYPE kiln_info gauge\nkiln_info{model=\"" << settings.model_id
    << "\",pipeline=\"" << settings.pipeline_class << "\",version=\"" << KILN_VERSION << "\"} 1\n";
  return m.str();
}

class Routes {
 public:
  Routes(const ServeSettings& settings, server::JobQueue& queue, std::atomic<bool>& stopping)
      : s_(settings), queue_(queue), stopping_(stopping) {}

  void install(httplib::Server& http) {
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return authorized(req, res) ? httplib::Server::HandlerResponse::Unhandled
                                  : httplib::Server::HandlerResponse::Handled;
    });
    // A status httplib set itself (413 for a body over the limit, 400 for a bad request line)
    // gets the JSON error body too.
    http.set_error_handler([](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 413) send_error(res, 413, "body", "the request body is larger than this server takes");
      else send_error(res, res.status, "request", "the request could not be read (HTTP status " + std::to_string(res.status) + ")");
    });
    http.Get("/", [](const httplib::Request&, httplib::Response& res) { res.set_content(kServePage, "text/html"); });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const server::QueueStats st = queue_.stats();
      send_json(res, stopping_ ? 503 : 200,
                {{"status", stopping_ ? "stopping" : "ok"},
                 {"queued", st.queued},
                 {"running", st.running},
                 {"ranks", s_.ranks}});
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      send_json(res, 200,
                {{"object", "list"},
                 {"data", json::array({{{"id", s_.model_id},
                                        {"object", "model"},
                                        {"owned_by", "kiln"},
                                        {"pipeline", s_.pipeline_class}}})}});
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(queue_.stats(), s_), "text/plain; version=0.0.4");
    });
    http.Post("/v1/images/generations", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = submit(req, res);
      if (id.empty()) return;
      const server::JobState state = queue_.wait(id);
      if (state == server::JobState::kDone) {
        json data = json::array();
        for (const std::string& png : queue_.images(id)) data.push_back({{"b64_json", io::base64_encode(png)}});
        send_json(res, 200, {{"created", int64_t(std::time(nullptr))}, {"id", id}, {"data", data}});
      } else {
        job_not_done(res, id, state);
      }
    });
    http.Post("/v1/jobs", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = submit(req, res);
      if (!id.empty()) send_json(res, 202, queue_.status(id));
    });
    http.Get(R"(/v1/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (const std::string id = job_id(req, res); !id.empty()) send_json(res, 200, queue_.status(id));
    });
    http.Delete(R"(/v1/jobs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      if (const std::string id = job_id(req, res); !id.empty()) {
        queue_.cancel(id);
        send_json(res, 200, queue_.status(id));
      }
    });
    http.Get(R"(/v1/jobs/([^/]+)/image)", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = job_id(req, res);
      if (id.empty()) return;
      const json status = queue_.status(id);
      if (status["state"] != "done") {
        send_error(res, 409, "id", "job " + id + " is " + status["state"].get<std::string>() + ", not done");
        return;
      }
      const std::vector<std::string> pngs = queue_.images(id);
      size_t index = 0;
      if (req.has_param("index")) {
        const std::string v = req.get_param_value("index");
        if (v.empty() || v.size() > 3 || v.find_first_not_of("0123456789") != std::string::npos ||
            std::stoul(v) >= pngs.size()) {
          send_error(res, 400, "index", "expected an image index in [0, " + std::to_string(pngs.size()) + ")");
          return;
        }
        index = std::stoul(v);
      }
      res.set_content(pngs.at(index), "image/png");
    });
    http.Get(R"(/v1/jobs/([^/]+)/events)", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = job_id(req, res);
      if (id.empty()) return;
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider("text/event-stream", [this, id, seen = size_t(0)](
                                                                size_t, httplib::DataSink& sink) mutable {
        const std::vector<server::JobEvent> events = queue_.events(id, seen, std::chrono::seconds(5));
        if (events.empty()) {
          if (!queue_.exists(id)) {
            sink.done();
            return true;
          }
          static const std::string keep_alive = ": waiting\n\n";  // an SSE comment: keeps proxies from timing out
          return sink.write(keep_alive.data(), keep_alive.size());
        }
        for (const server::JobEvent& e : events) {
          const std::string data = e.data.dump(-1, ' ', false, json::error_handler_t::replace);
          const std::string text = "event: " + e.type + "\ndata: " + data + "\n\n";
          if (!sink.write(text.data(), text.size())) return false;
          ++seen;
          if (e.type != "step") {
            sink.done();
            return true;
          }
        }
        return true;
      });
    });
    // Everything else: 405 for a known path with another method, 404 otherwise.
    const auto other = [](const httplib::Request& req, httplib::Response& res) {
      if (const std::string allow = allowed_methods(req.path); !allow.empty()) {
        res.set_header("Allow", allow);
        send_error(res, 405, "method", req.method + " " + req.path + " is not allowed; this path takes " + allow);
      } else {
        send_error(res, 404, "path", "no route " + req.path.substr(0, 200) + " (see docs/server.md)");
      }
    };
    http.Get(".*", other);
    http.Post(".*", other);
    http.Put(".*", other);
    http.Delete(".*", other);
    http.Patch(".*", other);
    http.Options(".*", other);
  }

 private:
  bool authorized(const httplib::Request& req, httplib::Response& res) const {
    if (s_.api_key.empty() || req.path == "/health" || req.path == "/") return true;
    const std::string header = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (header.rfind(prefix, 0) == 0 && same_secret(header.substr(prefix.size()), s_.api_key)) return true;
    res.set_header("WWW-Authenticate", "Bearer");
    send_error(res, 401, "Authorization", "expected the header Authorization: Bearer <the server's --api-key>");
    return false;
  }

  // The job id of /v1/jobs/{id}[/...]: "" (and the answer sent) when it is malformed or unknown.
  std::string job_id(const httplib::Request& req, httplib::Response& res) const {
    const std::string id = req.matches[1];
    if (!valid_job_id(id)) {
      send_error(res, 400, "id", "expected a job id of 16 hex digits, got '" + id.substr(0, 64) + "'");
      return "";
    }
    if (!queue_.exists(id)) {
      send_error(res, 404, "id", "no job " + id + " (finished jobs are kept for a while only)");
      return "";
    }
    return id;
  }

  // Parses and queues the body's job: its id, or "" with the answer sent (400/413/429/503).
  std::string submit(const httplib::Request& req, httplib::Response& res) {
    if (stopping_) {
      send_error(res, 503, "server", "the server is shutting down");
      return "";
    }
    server::GenerationRequest request;
    try {
      request = server::parse_generation_request(req.body, s_.limits, s_.defaults);
    } catch (const server::RequestError& e) {
      send_error(res, e.status(), e.field(), e.what());
      return "";
    }
    const std::string id = queue_.submit(std::move(request));
    if (id.empty()) {
      const double wait = queue_.estimated_wait_seconds();
      res.set_header("Retry-After", std::to_string(std::max<int64_t>(1, int64_t(wait + 0.999))));
      send_error(res, stopping_ ? 503 : 429, "server",
                 stopping_ ? "the server is shutting down" : "the queue is full; try again later");
    }
    return id;
  }

  void job_not_done(httplib::Response& res, const std::string& id, server::JobState state) {
    const std::string error = queue_.error(id);
    // 422 and 410, not 500 and 409: OpenAI's clients retry those, and the same call would fail
    // (e.g. a size that does not fit the memory) or be cancelled again.
    if (state == server::JobState::kFailed) send_error(res, 422, "job", "job " + id + " failed: " + error);
    else if (stopping_) send_error(res, 503, "server", "job " + id + " was cancelled: the server is shutting down");
    else send_error(res, 410, "job", "job " + id + " was cancelled");
  }

  const ServeSettings& s_;
  server::JobQueue& queue_;
  std::atomic<bool>& stopping_;
};

}  // namespace

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

int serve_http(const ServeSettings& settings, const server::ImageRunner& runner, const sigset_t& stop_signals) {
  server::JobQueue queue(settings.max_queue, runner, settings.keep_jobs);
  std::atomic<bool> stopping{false};
  httplib::Server http;
  http.set_payload_max_length(settings.max_body_bytes);
  http.set_read_timeout(std::chrono::seconds(settings.timeout_seconds));
  http.set_write_timeout(std::chrono::seconds(settings.timeout_seconds));
  http.set_keep_alive_timeout(5);
  // Each connection holds a thread while it is served (a request waiting for its image, an
  // event stream): enough of them that waiting clients never starve /health or new requests.
  http.new_task_queue = [] { return new httplib::ThreadPool(kConnectionThreads); };
  int listen_fd = -1;
  http.set_socket_options([&listen_fd](socket_t fd) {
    listen_fd = fd;
    httplib::default_socket_options(fd);
  });
  Routes routes(settings, queue, stopping);
  routes.install(http);
  const int port = settings.port == 0 ? http.bind_to_any_port(settings.host) : settings.port;
  KILN_CHECK(port > 0 && (settings.port == 0 || http.bind_to_port(settings.host, settings.port)), "serve",
             "cannot listen on ", settings.host, ":", settings.port, " (in use, or not an address of this machine)");
  // The library listens with a backlog of 5: a burst of clients would overflow it and see
  // resets. listen() again on the bound socket raises it.
  KILN_CHECK(listen_fd >= 0 && ::listen(listen_fd, SOMAXCONN) == 0, "serve", "cannot listen on ", settings.host, ":",
             port);
  std::fprintf(stderr, "kiln: serving %s on http://%s:%d\n", settings.model_id.c_str(), settings.host.c_str(), port);

  // SIGTERM / SIGINT / SIGUSR1: stop taking jobs, answer the queued ones, finish (or cancel) the
  // running one, then stop listening.
  std::thread signals([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    std::fprintf(stderr, "kiln: SIG%s: stopping (%s the running job)\n", sigabbrev_np(signal),
                 settings.cancel_on_stop ? "cancelling" : "finishing");
    stopping = true;
    queue.shutdown(settings.cancel_on_stop);
    http.stop();
  });
  const bool listened = http.listen_after_bind();
  if (!stopping) pthread_kill(signals.native_handle(), SIGTERM);  // listening failed: end the signal thread
  signals.join();
  KILN_CHECK(listened || stopping, "serve", "stopped listening on ", settings.host, ":", port, " unexpectedly");
  std::fprintf(stderr, "kiln: stopped\n");
  return 0;
}

}  // namespace kiln::cli
