// The HTTP side of `kiln serve` (on server::HttpServer): routes, the API key, the browser checks,
// metrics and the page, over a server::JobQueue whose jobs the given runner makes.
#pragma once
#include <signal.h>

#include <string>
#include <vector>

#include "server/generation_request.h"
#include "server/http_server.h"
#include "server/job_queue.h"

namespace kiln::cli {

struct ServeSettings {
  std::string host = "127.0.0.1";
  int port = 7860;  // 0: any free port (the one bound is printed)
  std::string api_key;  // non-empty: every route but /health and / needs "Authorization: Bearer KEY"
  size_t max_queue = 16;
  size_t keep_jobs = 64;  // finished jobs (their images) kept readable, the oldest forgotten first
  server::RequestLimits limits;
  server::HttpLimits http;  // connections, header and body sizes, the request deadline
  std::vector<std::string> allowed_hosts;  // --allowed-hosts: more names the Host header may give (no key)
  bool cancel_on_stop = false;   // SIGTERM/SIGINT: cancel the running job instead of finishing it
  std::string model_id, pipeline_class;
  int ranks = 1;  // --tp N: the processes that run each call
  PipelineCallArgs defaults;  // what a request leaves out
};

// True for names and addresses that only this machine reaches (localhost, 127.x, ::1).
bool is_loopback_host(const std::string& host);

// Serves until one of `stop_signals` arrives (they must be blocked in every thread); returns
// the exit code. Prints "kiln: serving on http://HOST:PORT" once it listens.
int serve_http(const ServeSettings& settings, const server::ImageRunner& runner, const sigset_t& stop_signals);

}  // namespace kiln::cli
