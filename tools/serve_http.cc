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
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/terminal.h"
#include "devices/runtime.h"
#include "exec/compile.h"
#include "io/base64.h"
#include "serve_page.h"
#include "server/browser_guard.h"

namespace kiln::cli {

namespace {

using nlohmann::json;

// OpenAI's error shape: {"error": {"message", "type", "param"}}; `param` names the field.
void send_error(server::HttpResponse& res, int status, const std::string& field, const std::string& message) {
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

void send_json(server::HttpResponse& res, int status, const json& body) {
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

std::string metrics_text(const server::QueueStats& s, const server::HttpCounters& c, const ServeSettings& settings) {
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
    << "# HELP kiln_http_connections Connections open now.\n# TYPE kiln_http_connections gauge\n"
    << "kiln_http_connections " << c.open << "\n"
    << "# HELP kiln_http_connections_total Connections accepted; evicted: closed while still sending a request, to "
       "admit a newer one over --max-connections or --max-client-connections; refused: closed at once, with "
       "nothing to evict; timed_out: a request not received, or an answer not taken, within --timeout.\n"
    << "# TYPE kiln_http_connections_total counter\n"
    << "kiln_http_connections_total{outcome=\"accepted\"} " << c.accepted << "\n"
    << "kiln_http_connections_total{outcome=\"evicted\"} " << c.evicted << "\n"
    << "kiln_http_connections_total{outcome=\"refused\"} " << c.refused << "\n"
    << "kiln_http_connections_total{outcome=\"timed_out\"} " << c.timed_out << "\n"
    << "# HELP kiln_info The model served.\n# TYPE kiln_info gauge\nkiln_info{model=\"" << settings.model_id
    << "\",pipeline=\"" << settings.pipeline_class << "\",version=\"" << KILN_VERSION << "\"} 1\n";
  return m.str();
}

// The routes: which one a path is, and the methods it takes.
enum class Route { kNone, kPage, kScript, kHealth, kModels, kMetrics, kGenerations, kJobs, kJob, kJobEvents, kJobImage };

struct RouteMatch {
  Route route = Route::kNone;
  std::string id;  // /v1/jobs/{id}...
};

RouteMatch match_route(const std::string& path) {
  static const std::map<std::string, Route> fixed = {
      {"/", Route::kPage},          {"/kiln.js", Route::kScript},
      {"/health", Route::kHealth},  {"/v1/models", Route::kModels},
      {"/metrics", Route::kMetrics}, {"/v1/images/generations", Route::kGenerations},
      {"/v1/jobs", Route::kJobs}};
  if (const auto it = fixed.find(path); it != fixed.end()) return {it->second, ""};
  static const std::string jobs = "/v1/jobs/";
  if (path.rfind(jobs, 0) != 0) return {};
  const std::string rest = path.substr(jobs.size());
  const size_t slash = rest.find('/');
  if (rest.empty() || slash == 0) return {};
  if (slash == std::string::npos) return {Route::kJob, rest};
  const std::string part = rest.substr(slash + 1);
  if (part == "events") return {Route::kJobEvents, rest.substr(0, slash)};
  if (part == "image") return {Route::kJobImage, rest.substr(0, slash)};
  return {};
}

std::string allowed_methods(Route route) {
  switch (route) {
    case Route::kNone: return "";
    case Route::kGenerations:
    case Route::kJobs: return "POST";
    case Route::kJob: return "GET, DELETE";
    default: return "GET";
  }
}

// Headers every answer carries: no framing (clickjacking), no type sniffing, no referrer.
void secure(server::HttpResponse& res) {
  res.set_header("X-Content-Type-Options", "nosniff");
  res.set_header("X-Frame-Options", "DENY");
  res.set_header("Referrer-Policy", "no-referrer");
  res.set_header("Content-Security-Policy", kServePagePolicy);
}

class Routes {
 public:
  Routes(const ServeSettings& settings, server::JobQueue& queue, std::atomic<bool>& stopping,
         const server::HttpServer& http)
      : s_(settings), queue_(queue), stopping_(stopping), http_(http), guard_(settings.host, settings.allowed_hosts) {}

  // server::HttpHandlers' three functions.
  std::optional<server::HttpResponse> admit_hook(const server::HttpRequest& req) const {
    server::HttpResponse res;
    if (!admit(req, res)) return res;
    return std::nullopt;
  }
  server::HttpReply handle_hook(const server::HttpRequest& req) { return handle(req); }
  static server::HttpResponse refusal(int status, const std::string& message) {
    server::HttpResponse res;
    send_error(res, status, status == 413 ? "body" : status == 431 ? "headers" : "request", message);
    secure(res);
    return res;
  }

 private:
  // Checks made on the headers, before any body is read: false when answered (res).
  bool admit(const server::HttpRequest& req, server::HttpResponse& res) const {
    secure(res);
    const RouteMatch m = match_route(req.path);
    if (!s_.api_key.empty()) {
      if (m.route != Route::kHealth && m.route != Route::kPage && m.route != Route::kScript && !authorized(req)) {
        res.set_header("WWW-Authenticate", "Bearer");
        send_error(res, 401, "Authorization", "expected the header Authorization: Bearer <the server's --api-key>");
        return false;
      }
    } else if (const std::string why = guard_.refusal(req); !why.empty()) {
      send_error(res, 403, server::BrowserGuard::refused_header(why), why);
      return false;
    }
    const std::string allow = allowed_methods(m.route);
    if (allow.empty()) {
      send_error(res, 404, "path", "no route " + req.path.substr(0, 200) + " (see docs/server.md)");
      return false;
    }
    if (allow.find(req.method) == std::string::npos || req.method.empty()) {
      res.set_header("Allow", allow);
      send_error(res, 405, "method",
                 req.method.substr(0, 20) + " " + req.path.substr(0, 200) + " is not allowed; this path takes " + allow);
      return false;
    }
    return true;
  }

  bool authorized(const server::HttpRequest& req) const {
    const std::string header = req.header("Authorization");
    const std::string prefix = "Bearer ";
    return header.rfind(prefix, 0) == 0 && same_secret(header.substr(prefix.size()), s_.api_key);
  }

  server::HttpReply handle(const server::HttpRequest& req) {
    const RouteMatch m = match_route(req.path);
    server::HttpResponse res;
    secure(res);
    switch (m.route) {
      case Route::kPage: res.set_content(kServePage, "text/html; charset=utf-8"); break;
      case Route::kScript: res.set_content(kServePageScript, "text/javascript; charset=utf-8"); break;
      case Route::kHealth: {
        const server::QueueStats st = queue_.stats();
        send_json(res, stopping_ ? 503 : 200,
                  {{"status", stopping_ ? "stopping" : "ok"},
                   {"queued", st.queued},
                   {"running", st.running},
                   {"ranks", s_.ranks}});
        break;
      }
      case Route::kModels:
        send_json(res, 200,
                  {{"object", "list"},
                   {"data", json::array({{{"id", s_.model_id},
                                          {"object", "model"},
                                          {"owned_by", "kiln"},
                                          {"pipeline", s_.pipeline_class}}})}});
        break;
      case Route::kMetrics: res.set_content(metrics_text(queue_.stats(), http_.counters(), s_), "text/plain; version=0.0.4"); break;
      case Route::kGenerations: {
        const std::string id = submit(req, res);
        if (id.empty()) break;
        // Answered when the job ends: polled on the loop whenever the queue changes.
        return server::HttpReply::Deferred{[this, id]() -> std::optional<server::HttpResponse> {
          server::HttpResponse done;
          secure(done);
          if (!queue_.exists(id)) {
            job_not_done(done, id, server::JobState::kCancelled);
            return done;
          }
          const std::string state = queue_.status(id)["state"];
          if (state == "queued" || state == "running") return std::nullopt;
          if (state == "done") {
            json data = json::array();
            for (const std::string& png : queue_.images(id)) data.push_back({{"b64_json", io::base64_encode(png)}});
            send_json(done, 200, {{"created", int64_t(std::time(nullptr))}, {"id", id}, {"data", data}});
          } else {
            job_not_done(done, id, state == "failed" ? server::JobState::kFailed : server::JobState::kCancelled);
          }
          return done;
        }};
      }
      case Route::kJobs:
        if (const std::string id = submit(req, res); !id.empty()) send_json(res, 202, queue_.status(id));
        break;
      case Route::kJob:
        if (job_known(m.id, res)) {
          if (req.method == "DELETE") queue_.cancel(m.id);
          send_json(res, 200, queue_.status(m.id));
        }
        break;
      case Route::kJobImage:
        if (job_known(m.id, res)) image(req, m.id, res);
        break;
      case Route::kJobEvents:
        if (job_known(m.id, res)) return events(m.id);
        break;
      case Route::kNone: break;  // admit answered it
    }
    return res;
  }

  void image(const server::HttpRequest& req, const std::string& id, server::HttpResponse& res) const {
    const json status = queue_.status(id);
    if (status["state"] != "done") {
      send_error(res, 409, "id", "job " + id + " is " + status["state"].get<std::string>() + ", not done");
      return;
    }
    const std::vector<std::string> pngs = queue_.images(id);
    size_t index = 0;
    if (const std::optional<std::string> v = req.param("index")) {
      if (v->empty() || v->size() > 3 || v->find_first_not_of("0123456789") != std::string::npos ||
          std::stoul(*v) >= pngs.size()) {
        send_error(res, 400, "index", "expected an image index in [0, " + std::to_string(pngs.size()) + ")");
        return;
      }
      index = std::stoul(*v);
    }
    res.set_content(pngs.at(index), "image/png");
  }

  // Server-Sent Events: every event of the job in order, then the stream ends; a comment every
  // few seconds while nothing happens, so proxies keep the stream and a gone client is noticed.
  server::HttpReply events(const std::string& id) {
    server::HttpReply::Stream stream;
    stream.head.set_header("Content-Type", "text/event-stream");
    stream.head.set_header("Cache-Control", "no-cache");
    secure(stream.head);
    stream.next = [this, id, seen = size_t(0), quiet_since = std::chrono::steady_clock::now()](std::string& out) mutable {
      const std::vector<server::JobEvent> events = queue_.events(id, seen, std::chrono::milliseconds(0));
      if (events.empty()) {
        if (!queue_.exists(id)) return false;
        if (std::chrono::steady_clock::now() - quiet_since >= std::chrono::seconds(5)) {
          out += ": waiting\n\n";  // an SSE comment
          quiet_since = std::chrono::steady_clock::now();
        }
        return true;
      }
      quiet_since = std::chrono::steady_clock::now();
      for (const server::JobEvent& e : events) {
        out += "event: " + e.type + "\ndata: " + e.data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        ++seen;
        if (e.type != "step") return false;
      }
      return true;
    };
    return stream;
  }

  // Whether /v1/jobs/{id}[/...] names a job: when not (malformed or unknown), the answer is set.
  bool job_known(const std::string& id, server::HttpResponse& res) const {
    if (!valid_job_id(id)) {
      send_error(res, 400, "id", "expected a job id of 16 hex digits, got '" + id.substr(0, 64) + "'");
      return false;
    }
    if (!queue_.exists(id)) {
      send_error(res, 404, "id", "no job " + id + " (finished jobs are kept for a while only)");
      return false;
    }
    return true;
  }

  // Parses and queues the body's job: its id, or "" with the answer set (400/413/429/503).
  std::string submit(const server::HttpRequest& req, server::HttpResponse& res) {
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

  void job_not_done(server::HttpResponse& res, const std::string& id, server::JobState state) const {
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
  const server::HttpServer& http_;
  const server::BrowserGuard guard_;
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
  std::unique_ptr<Routes> routes;
  server::HttpServer http(settings.http, server::HttpHandlers{
                                             [&routes](const server::HttpRequest& r) { return routes->admit_hook(r); },
                                             [&routes](const server::HttpRequest& r) { return routes->handle_hook(r); },
                                             [](int status, const std::string& message) {
                                               return Routes::refusal(status, message);
                                             }});
  routes = std::make_unique<Routes>(settings, queue, stopping, http);
  const int port = http.bind(settings.host, settings.port);
  // Waiting answers and event streams are polled whenever a job is queued, steps or ends.
  queue.on_change([&http] { http.notify(); });
  // One line per job that ran: what a server's log is read for.
  queue.on_finished([](const server::FinishedJob& j) {
    const std::string size =
        j.height ? std::to_string(j.height) + "x" + std::to_string(j.width) : std::string("default size");
    print_line(stderr, "kiln: job %s: %s, %lld steps, %lld image%s: %s in %.2f s%s%s", j.id.c_str(), size.c_str(),
               static_cast<long long>(j.steps), static_cast<long long>(j.images), j.images == 1 ? "" : "s",
               server::job_state_name(j.state), j.seconds, j.error.empty() ? "" : ": ", j.error.c_str());
  });
  print_line(stderr, "kiln: serving %s on http://%s:%d", settings.model_id.c_str(), settings.host.c_str(), port);

  // SIGTERM / SIGINT / SIGUSR1: idle and half-read connections are closed, new requests answered
  // 503, queued jobs cancelled; the running job finishes (or is cancelled) and its clients are
  // answered; then the server stops.
  std::thread signals([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    std::fprintf(stderr, "kiln: SIG%s: stopping (%s the running job)\n", sigabbrev_np(signal),
                 settings.cancel_on_stop ? "cancelling" : "finishing");
    stopping = true;
    http.stop();
    queue.shutdown(settings.cancel_on_stop);
    http.notify();
    http.drain();
  });
  http.run();
  if (!stopping) pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  queue.on_change(nullptr);
  std::fprintf(stderr, "kiln: stopped\n");
  return 0;
}

}  // namespace kiln::cli
