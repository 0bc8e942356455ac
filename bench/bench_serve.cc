// Requests per second and latency of `kiln serve` against a fresh `kiln generate` per image:
// starts the server (loopback, any free port) with the given model and flags, warms it with one
// request, then times sequential requests from one client and concurrent requests from several,
// and times `kiln generate` for the same call. Run outside CTest (docs/benchmarks.md):
//   build/bench/bench_serve [--model DIR] [--size WxH] [--steps N] [--requests R] [--clients C]
//                           [--generate-runs G] [--launcher "mpirun -np 2"] [-- SERVE FLAGS...]
// --launcher starts both kiln processes (its words before the kiln path): with --tp N in the
// serve flags, the server and generate run on N ranks.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "spawn_util.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

using kiln::test::read_text_file;
using kiln::test::spawn_logged;

struct Timed {
  std::vector<double> latencies;
  double wall = 0;
  int failed = 0;
};

Timed run_clients(int port, int clients, int requests_each, const std::string& body) {
  Timed t;
  std::mutex mu;
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(std::chrono::hours(1));
      for (int r = 0; r < requests_each; ++r) {
        const auto begin = Clock::now();
        const auto res = client.Post("/v1/images/generations", body, "application/json");
        const double s = seconds_since(begin);
        std::lock_guard<std::mutex> lock(mu);
        if (res && res->status == 200) t.latencies.push_back(s);
        else ++t.failed;
      }
    });
  for (std::thread& th : threads) th.join();
  t.wall = seconds_since(start);
  return t;
}

void print_row(const char* what, const Timed& t) {
  std::printf("| %s | %zu | %.3f | %.3f | %.3f | %.3f | %d |\n", what, t.latencies.size(),
              double(t.latencies.size()) / t.wall, percentile(t.latencies, 0.5), percentile(t.latencies, 0.99),
              t.wall, t.failed);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, size = "", prompt = "a photograph of an astronaut riding a horse";
  int steps = 0, requests = 8, clients = 4, generate_runs = 3;
  std::vector<std::string> serve_flags, launcher;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--model") model = next();
    else if (a == "--size") size = next();
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--requests") requests = std::stoi(next());
    else if (a == "--clients") clients = std::stoi(next());
    else if (a == "--generate-runs") generate_runs = std::stoi(next());
    else if (a == "--launcher") {
      std::istringstream words(next());
      for (std::string w; words >> w;) launcher.push_back(w);
    }
    else if (a == "--") {
      serve_flags.assign(argv + i + 1, argv + argc);
      break;
    } else {
      std::fprintf(stderr, "bench_serve: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const fs::path dir = fs::temp_directory_path() / ("kiln_bench_serve_" + std::to_string(::getpid()));
  fs::create_directories(dir);

  nlohmann::json body{{"prompt", prompt}, {"seed", 0}};
  std::vector<std::string> gen = launcher;
  gen.insert(gen.end(), {KILN_CLI_PATH, "generate", "--prompt", prompt, "--out", (dir / "g.png").string()});
  if (!model.empty()) gen.insert(gen.end(), {"--model", model});
  if (!size.empty()) {
    body["size"] = size;
    const size_t x = size.find('x');
    gen.insert(gen.end(), {"--width", size.substr(0, x), "--height", size.substr(x + 1)});
  }
  if (steps > 0) {
    body["steps"] = steps;
    gen.insert(gen.end(), {"--steps", std::to_string(steps)});
  }
  // The serve flags that generate shares (--mode, --dtype, ...) apply to its runs too.
  for (size_t i = 0; i < serve_flags.size(); ++i) gen.push_back(serve_flags[i]);

  // Fresh processes: load, (compile,) one image, exit.
  std::vector<double> fresh;
  for (int r = 0; r < generate_runs; ++r) {
    const auto start = Clock::now();
    const pid_t pid = spawn_logged(gen, dir / "generate.log");
    int status = 0;
    if (pid <= 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "bench_serve: kiln generate failed:\n%s", read_text_file(dir / "generate.log").c_str());
      return 1;
    }
    fresh.push_back(seconds_since(start));
  }

  std::vector<std::string> serve = launcher;
  serve.insert(serve.end(), {KILN_CLI_PATH, "serve", "--port", "0", "--max-queue", "100000", "--max-steps", "10000"});
  if (!model.empty()) serve.insert(serve.end(), {"--model", model});
  serve.insert(serve.end(), serve_flags.begin(), serve_flags.end());
  const auto start = Clock::now();
  const pid_t server = spawn_logged(serve, dir / "serve.log");
  if (server <= 0) {
    std::fprintf(stderr, "bench_serve: cannot start %s\n", serve[0].c_str());
    return 1;
  }
  int port = 0;
  const std::regex serving(R"(serving .* on http://[^:]+:(\d+))");
  while (port == 0 && seconds_since(start) < 3600) {
    std::smatch m;
    const std::string log = read_text_file(dir / "serve.log");
    if (std::regex_search(log, m, serving)) port = std::stoi(m[1]);
    else if (::waitpid(server, nullptr, WNOHANG) == server) break;
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (port == 0) {
    std::fprintf(stderr, "bench_serve: the server did not start:\n%s", read_text_file(dir / "serve.log").c_str());
    return 1;
  }
  const double startup = seconds_since(start);
  const Timed first = run_clients(port, 1, 1, body.dump());  // the server's first request (warm-up)
  const Timed sequential = run_clients(port, 1, requests, body.dump());
  const Timed concurrent = run_clients(port, clients, std::max(1, requests / clients), body.dump());
  ::kill(server, launcher.empty() ? SIGTERM : SIGUSR1);  // mpirun forwards SIGUSR1 (docs/server.md)
  ::waitpid(server, nullptr, 0);
  fs::remove_all(dir);

  std::printf("call: %s; serve flags:", body.dump().c_str());
  for (const std::string& f : serve_flags) std::printf(" %s", f.c_str());
  // Compiled mode compiles at a size's first request (unless --warmup): the first request's time.
  std::printf("\nserver start (until it listens): %.3f s; first request %.3f s\n\n", startup,
              first.latencies.empty() ? -1.0 : first.latencies[0]);
  std::printf("| clients | images | images/s | p50 s | p99 s | wall s | failed |\n|---|---|---|---|---|---|---|\n");
  print_row("1 (sequential)", sequential);
  print_row((std::to_string(clients) + " (concurrent)").c_str(), concurrent);
  const double fresh_p50 = percentile(fresh, 0.5), served_p50 = percentile(sequential.latencies, 0.5);
  std::printf("\nfresh kiln generate per image (%d runs): p50 %.3f s (min %.3f, max %.3f); a served request saves "
              "%.3f s (%.1fx)\n",
              generate_runs, fresh_p50, *std::min_element(fresh.begin(), fresh.end()),
              *std::max_element(fresh.begin(), fresh.end()), fresh_p50 - served_p50, fresh_p50 / served_p50);
  return sequential.failed + concurrent.failed + first.failed == 0 ? 0 : 1;
}
