// `kiln serve` as clients see it: the real server process on an ephemeral loopback port, real
// HTTP requests (cpp-httplib's client). Its images equal `kiln generate`'s PNG byte for byte,
// events arrive one per step in order, cancellation works for queued and running jobs, a full
// queue answers 429, bad requests get the right status naming the field, concurrent clients
// lose no job, and SIGTERM ends the process with 0 after answering everyone.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "headless_browser.h"
#include "serve_process.h"
#include "spawn_util.h"
#include "test_util.h"


namespace kiln {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using namespace std::chrono_literals;
using namespace serve_test;

class Serve : public testing::Test {
 protected:
  fs::path dir() const { return tmp_.path(); }
  // `kiln generate` on the bundled checkpoint (started by `launcher` when given): its PNG bytes.
  std::string generate_png(const std::string& flags, const std::string& launcher = "") {
    const fs::path out = dir() / "generate.png";
    const std::string cmd = launcher + " " + KILN_CLI_PATH + " generate " + flags + " --out " + out.string() +
                            " 2>/dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return test::read_text_file(out);
  }
  test::ScopedTempDir tmp_{"serve_" + std::string(testing::UnitTest::GetInstance()->current_test_info()->name())};
};

TEST_F(Serve, ImagesEqualGeneratesPngByteForByte) {
  ServerProcess server(dir());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const json body{{"prompt", "a red fox in the snow"}, {"size", "128x96"}, {"steps", 3}, {"seed", 7}};
  const std::string expected = generate_png("--prompt \"a red fox in the snow\" --width 128 --height 96 --steps 3 --seed 7");
  ASSERT_FALSE(expected.empty());

  const json answer = post_json(c, "/v1/images/generations", body, 200);
  ASSERT_EQ(answer["data"].size(), 1u);
  EXPECT_EQ(b64_png(answer), expected) << "POST /v1/images/generations";

  const json queued = post_json(c, "/v1/jobs", body, 202);
  const std::string id = queued["id"];
  wait_status(c, id, [](const json& s) { return s["state"] == "done"; });
  const auto image = c.Get(("/v1/jobs/" + id + "/image").c_str());
  ASSERT_TRUE(image);
  EXPECT_EQ(image->status, 200);
  EXPECT_EQ(image->get_header_value("Content-Type"), "image/png");
  EXPECT_EQ(image->body, expected) << "GET /v1/jobs/{id}/image";

  // FLUX.1's real classifier-free guidance (call arguments by their Diffusers names).
  EXPECT_EQ(b64_png(post_json(c, "/v1/images/generations",
                              {{"prompt", "a red fox"}, {"negative_prompt", "blurry"}, {"true_cfg_scale", 4.0},
                               {"steps", 2}, {"seed", 7}},
                              200)),
            generate_png("--prompt \"a red fox\" --negative-prompt blurry --true-cfg-scale 4 --steps 2 --seed 7"))
      << "true_cfg_scale";

  // n images: seeds seed, seed + 1, ... each the image generate makes from that seed.
  const json two = post_json(c, "/v1/images/generations",
                             {{"prompt", "a red fox in the snow"}, {"size", "128x96"}, {"steps", 3}, {"seed", 7}, {"n", 2}},
                             200);
  ASSERT_EQ(two["data"].size(), 2u);
  EXPECT_EQ(b64_png(two, 0), expected);
  EXPECT_EQ(b64_png(two, 1),
            generate_png("--prompt \"a red fox in the snow\" --width 128 --height 96 --steps 3 --seed 8"));
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

// The body of an SSE stream as (event, data) pairs.
std::vector<std::pair<std::string, json>> read_events(httplib::Client& c, const std::string& id) {
  std::string text;
  const auto res = c.Get(("/v1/jobs/" + id + "/events").c_str(), [&](const char* data, size_t n) {
    text.append(data, n);
    return true;
  });
  EXPECT_TRUE(res);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  std::vector<std::pair<std::string, json>> events;
  const std::regex event(R"(event: (\w+)\ndata: ([^\n]*)\n\n)");
  for (std::sregex_iterator it(text.begin(), text.end(), event), end; it != end; ++it)
    events.emplace_back((*it)[1], json::parse((*it)[2].str()));
  return events;
}

TEST_F(Serve, EventsArriveOnePerStepInOrderThenDone) {
  ServerProcess server(dir());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const json job = post_json(c, "/v1/jobs", {{"prompt", "a lighthouse"}, {"steps", 5}, {"n", 2}}, 202);
  const auto events = read_events(c, job["id"]);
  ASSERT_EQ(events.size(), 11u);  // 2 images x 5 steps, then done
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(events[i].first, "step");
    EXPECT_EQ(events[i].second["image"], int(i / 5));
    EXPECT_EQ(events[i].second["step"], int(i % 5 + 1));
    EXPECT_EQ(events[i].second["steps"], 5);
    EXPECT_GT(events[i].second["seconds"].get<double>(), 0);
  }
  EXPECT_EQ(events[10].first, "done");
  // A finished job's stream replays its events.
  EXPECT_EQ(read_events(c, job["id"]).size(), 11u);
  // The server's log says what each job was and how it ended, one line.
  const std::string line = "kiln: job " + job["id"].get<std::string>() + ": 128x128, 5 steps, 2 images: done in ";
  EXPECT_NE(server.log().find(line), std::string::npos) << server.log();
}

TEST_F(Serve, CancelsQueuedAndRunningJobsAndKeepsServing) {
  ServerProcess server(dir(), {"--max-steps", "10000"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const json long_job{{"prompt", "a long job"}, {"steps", 10000}};
  const std::string running = post_json(c, "/v1/jobs", long_job, 202)["id"];
  const std::string queued = post_json(c, "/v1/jobs", long_job, 202)["id"];
  wait_status(c, running, [](const json& s) { return s["state"] == "running" && s["step"] >= 1; });
  EXPECT_EQ(json::parse(c.Get(("/v1/jobs/" + queued).c_str())->body)["state"], "queued");

  // Queued: it leaves the queue at once.
  const auto cancel_queued = c.Delete(("/v1/jobs/" + queued).c_str());
  ASSERT_TRUE(cancel_queued);
  EXPECT_EQ(cancel_queued->status, 200);
  EXPECT_EQ(json::parse(cancel_queued->body)["state"], "cancelled");
  EXPECT_EQ(json::parse(c.Get(("/v1/jobs/" + queued).c_str())->body)["step"], 0);

  // Running: it stops at the next step boundary, long before its 10000 steps.
  ASSERT_EQ(c.Delete(("/v1/jobs/" + running).c_str())->status, 200);
  const json ended = wait_status(c, running, [](const json& s) { return s["state"] != "running"; });
  EXPECT_EQ(ended["state"], "cancelled");
  EXPECT_LT(ended["step"].get<int>(), 10000);
  const auto events = read_events(c, running);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().first, "cancelled");
  EXPECT_EQ(c.Get(("/v1/jobs/" + running + "/image").c_str())->status, 409);
  EXPECT_NE(server.log().find("kiln: job " + running + ": 128x128, 10000 steps, 1 image: cancelled in "),
            std::string::npos)
      << server.log();

  // The pipeline is intact: the next job's image is generate's.
  const json answer = post_json(c, "/v1/images/generations", {{"prompt", "after"}, {"steps", 2}}, 200);
  EXPECT_EQ(b64_png(answer), generate_png("--prompt after --steps 2"));
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

TEST_F(Serve, FullQueueAnswers429WithRetryAfter) {
  ServerProcess server(dir(), {"--max-queue", "1", "--max-steps", "10000"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const json long_job{{"prompt", "a long job"}, {"steps", 10000}};
  const std::string running = post_json(c, "/v1/jobs", long_job, 202)["id"];
  wait_status(c, running, [](const json& s) { return s["state"] == "running" && s["step"] >= 1; });
  const std::string queued = post_json(c, "/v1/jobs", long_job, 202)["id"];
  const auto full = c.Post("/v1/jobs", long_job.dump(), "application/json");
  ASSERT_TRUE(full);
  EXPECT_EQ(full->status, 429);
  EXPECT_GE(std::stol(full->get_header_value("Retry-After")), 1);
  EXPECT_EQ(json::parse(full->body)["error"]["param"], "server");
  const std::string metrics = c.Get("/metrics")->body;
  EXPECT_NE(metrics.find("kiln_jobs_total{outcome=\"rejected\"} 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("kiln_queue_depth 1\n"), std::string::npos) << metrics;
  c.Delete(("/v1/jobs/" + queued).c_str());
  c.Delete(("/v1/jobs/" + running).c_str());
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

TEST_F(Serve, BadRequestsGetTheirStatusNamingTheField) {
  ServerProcess server(dir(), {"--max-body", "4096"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  struct Case {
    std::string method, path, body;
    int status;
    std::string field;
  };
  const std::string big(5000, 'x');
  const std::vector<Case> cases = {
      {"POST", "/v1/images/generations", "{\"prompt\": ", 400, "body"},
      {"POST", "/v1/images/generations", "[1, 2]", 400, "body"},
      {"POST", "/v1/images/generations", "{}", 400, "prompt"},
      {"POST", "/v1/images/generations", R"({"prompt": 5})", 400, "prompt"},
      {"POST", "/v1/images/generations", R"({"prompt": ""})", 400, "prompt"},
      {"POST", "/v1/images/generations", R"({"prompt": "a\u0000b"})", 400, "prompt"},
      {"POST", "/v1/images/generations", R"({"prompt": "red \u001b[31m fox"})", 400, "prompt"},
      {"POST", "/v1/jobs", R"({"prompt": "x", "negative_prompt": "\u0085"})", 400, "negative_prompt"},
      {"POST", "/v1/images/generations", R"({"prompt": "x", "size": "0x0"})", 400, "size"},
      {"POST", "/v1/images/generations", R"({"prompt": "x", "size": "99999x99999"})", 400, "size"},
      {"POST", "/v1/images/generations", R"({"prompt": "x", "size": "100x100"})", 400, "size"},
      {"POST", "/v1/images/generations", R"({"prompt": "x", "size": 512})", 400, "size"},
      {"POST", "/v1/images/generations", R"({"prompt": "x", "steps": 0})", 400, "steps"},
      {"POST", "/v1/images/generations", R"({"prompt": "x", "steps": "4"})", 400, "steps"},
      {"POST", "/v1/images/generations", R"({"prompt": "x", "steps": 1.5})", 400, "steps"},
      {"POST", "/v1/jobs", R"({"prompt": "x", "n": 99})", 400, "n"},
      {"POST", "/v1/jobs", R"({"prompt": "x", "seed": -1})", 400, "seed"},
      {"POST", "/v1/jobs", R"({"prompt": "x", "guidance_scale": "high"})", 400, "guidance_scale"},
      {"POST", "/v1/jobs", R"({"prompt": "x", "response_format": "url"})", 400, "response_format"},
      {"POST", "/v1/jobs", R"({"prompt": "x", "colour": "red"})", 400, "colour"},
      {"POST", "/v1/jobs", R"({"prompt": "x", "max_sequence_length": 513})", 400, "max_sequence_length"},
      {"POST", "/v1/jobs", "{\"prompt\": \"" + big + "\"}", 413, "body"},
      {"GET", "/v1/jobs/0123456789abcdef", "", 404, "id"},
      {"GET", "/v1/jobs/..%2F..%2Fetc%2Fpasswd", "", 404, "path"},  // decoded before routing: no such route
      {"GET", "/v1/jobs/../../etc/passwd/image", "", 404, "path"},
      {"GET", "/v1/jobs/%2e%2e/image", "", 400, "id"},
      {"DELETE", "/v1/jobs/ABCDEF0123456789", "", 400, "id"},
      {"GET", "/v1/nothing", "", 404, "path"},
      {"DELETE", "/health", "", 405, "method"},
      {"GET", "/v1/images/generations", "", 405, "method"},
  };
  for (const Case& k : cases) {
    httplib::Result res = k.method == "POST"  ? c.Post(k.path.c_str(), k.body, "application/json")
                          : k.method == "GET" ? c.Get(k.path.c_str())
                                              : c.Delete(k.path.c_str());
    ASSERT_TRUE(res) << k.method << " " << k.path;
    EXPECT_EQ(res->status, k.status) << k.method << " " << k.path << " " << k.body.substr(0, 80) << " -> " << res->body;
    const json error = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(error.is_object() && error.contains("error")) << res->body;
    EXPECT_EQ(error["error"]["param"], k.field) << k.method << " " << k.path << " " << k.body.substr(0, 80);
    EXPECT_FALSE(error["error"]["message"].get<std::string>().empty());
    if (k.status == 405) {
      EXPECT_FALSE(res->get_header_value("Allow").empty());
    }
    ASSERT_EQ(c.Get("/health")->status, 200) << "after " << k.method << " " << k.path;
  }
  // Nothing bad was queued.
  EXPECT_NE(c.Get("/metrics")->body.find("kiln_jobs_total{outcome=\"submitted\"} 0\n"), std::string::npos);
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

TEST_F(Serve, ApiKeyIsRequiredWhereGivenAndForOtherMachines) {
  ServerProcess server(dir(), {"--api-key", "s3cret-key"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  EXPECT_EQ(c.Get("/health")->status, 200);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  const httplib::Headers wrong = {{"Authorization", "Bearer s3cret-kez"}}, right = {{"Authorization", "Bearer s3cret-key"}};
  const auto refused = c.Get("/v1/models", wrong);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(json::parse(refused->body)["error"]["param"], "Authorization");
  EXPECT_EQ(c.Post("/v1/jobs", wrong, R"({"prompt": "x"})", "application/json")->status, 401);
  const auto models = c.Get("/v1/models", right);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["pipeline"], "FluxPipeline");
  EXPECT_EQ(server.terminate(), 0) << server.log();

  // Listening where other machines reach it without a key is refused before loading.
  ServerProcess open(dir(), {"--host", "0.0.0.0"});
  EXPECT_EQ(open.wait_exit(), 1);
  EXPECT_NE(open.log().find("--host 0.0.0.0 is reachable from other machines: it needs --api-key"), std::string::npos)
      << open.log();
}

// What 16 clients sending 3 requests each at once saw: answers by status, images by prompt.
struct LoadRun {
  std::map<int, int> statuses;
  std::map<std::string, std::set<std::string>> images_by_prompt;
};

LoadRun run_load(const ServerProcess& server, int clients_n, int requests) {
  LoadRun run;
  std::mutex mu;
  std::vector<std::thread> clients;
  for (int t = 0; t < clients_n; ++t)
    clients.emplace_back([&, t] {
      httplib::Client c = server.client();
      for (int r = 0; r < requests; ++r) {
        const std::string prompt = "prompt " + std::to_string((t + r) % 3);
        const auto res = c.Post("/v1/images/generations", json{{"prompt", prompt}, {"steps", 2}}.dump(), "application/json");
        std::lock_guard<std::mutex> lock(mu);
        ++run.statuses[res ? res->status : -1];
        if (!res) ADD_FAILURE() << "client " << t << " request " << r << ": " << httplib::to_string(res.error());
        if (res && res->status == 200) run.images_by_prompt[prompt].insert(b64_png(json::parse(res->body)));
      }
    });
  for (std::thread& t : clients) t.join();
  return run;
}

TEST_F(Serve, ConcurrentClientsLoseNoJobAndMetricsAgree) {
  // Few finished jobs kept, so what the server keeps by design is full before RSS is measured.
  ServerProcess server(dir(), {"--max-queue", "4", "--keep-jobs", "4"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  auto rss = [&] {
    const std::string m = c.Get("/metrics")->body;
    std::smatch match;
    EXPECT_TRUE(std::regex_search(m, match, std::regex(R"(kiln_host_resident_bytes (\d+))")));
    return std::stod(match[1]);
  };
  constexpr int kClients = 16, kRequests = 3;
  // The same load twice before RSS is read: what the server's threads allocate the first times
  // they serve (their stacks, glibc's per-thread malloc arenas) is not a leak; it levels off
  // after two such runs.
  LoadRun warm = run_load(server, kClients, kRequests);
  const LoadRun warm2 = run_load(server, kClients, kRequests);
  for (const auto& [status, n] : warm2.statuses) warm.statuses[status] += n;
  for (const auto& [prompt, images] : warm2.images_by_prompt)
    warm.images_by_prompt[prompt].insert(images.begin(), images.end());
  const double rss_before = rss();
  const LoadRun run = run_load(server, kClients, kRequests);
  const double rss_after = rss();

  int done = 0, rejected = 0;
  for (const LoadRun* r : std::initializer_list<const LoadRun*>{&warm, &run}) {
    int answered = 0;
    for (const auto& [status, n] : r->statuses) {
      EXPECT_TRUE(status == 200 || status == 429) << "status " << status << " x" << n;
      answered += n;
    }
    EXPECT_EQ(answered, (r == &warm ? 2 : 1) * kClients * kRequests);  // every request answered
    EXPECT_GT(r->statuses.at(200), 0);
    done += r->statuses.at(200);
    rejected += r->statuses.count(429) ? r->statuses.at(429) : 0;
  }
  // Identical arguments, identical images, in both runs.
  for (const auto& [prompt, images] : run.images_by_prompt) {
    std::set<std::string> all = images;
    if (warm.images_by_prompt.count(prompt)) all.insert(warm.images_by_prompt.at(prompt).begin(), warm.images_by_prompt.at(prompt).end());
    EXPECT_EQ(all.size(), 1u) << prompt;
  }
  // The counters are what the clients saw: no job lost or run twice.
  const std::string m = c.Get("/metrics")->body;
  EXPECT_NE(m.find("kiln_jobs_total{outcome=\"submitted\"} " + std::to_string(done) + "\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_jobs_total{outcome=\"done\"} " + std::to_string(done) + "\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_jobs_total{outcome=\"rejected\"} " + std::to_string(rejected) + "\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_jobs_total{outcome=\"failed\"} 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_step_seconds_count " + std::to_string(2 * done) + "\n"), std::string::npos) << m;
  EXPECT_LT(std::abs(rss_after - rss_before) / rss_before, 0.05) << "RSS before " << rss_before << ", after " << rss_after;
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

TEST_F(Serve, SigtermFinishesTheRunningJobAnswersQueuedOnesAndExitsZero) {
  ServerProcess server(dir(), {"--max-steps", "10000"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const std::string running = post_json(c, "/v1/jobs", {{"prompt", "finishes"}, {"steps", 300}}, 202)["id"];
  wait_status(c, running, [](const json& s) { return s["state"] == "running" && s["step"] >= 1; });
  // A queued request waits for its answer on its own connection.
  std::optional<int> queued_status;
  std::thread queued_client([&] {
    httplib::Client q = server.client();
    const auto res = q.Post("/v1/images/generations", R"({"prompt": "queued", "steps": 300})", "application/json");
    queued_status = res ? res->status : -1;
  });
  for (int i = 0; i < 500 && c.Get("/metrics")->body.find("kiln_queue_depth 1\n") == std::string::npos; ++i)
    std::this_thread::sleep_for(10ms);
  std::string events_text;
  std::atomic<bool> following{false};
  std::thread events_client([&] {
    httplib::Client e = server.client();
    e.Get(("/v1/jobs/" + running + "/events").c_str(), [&](const char* data, size_t n) {
      events_text.append(data, n);
      following = true;
      return true;
    });
  });
  // SIGTERM only once the stream is open: sent earlier, the server would refuse the connection.
  for (int i = 0; i < 1000 && !following; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.terminate(), 0) << server.log();
  queued_client.join();
  events_client.join();
  EXPECT_EQ(queued_status, 503);
  // The running job ran to its end: its stream ends with done after step 300.
  const std::regex event(R"(event: (\w+)\ndata: ([^\n]*)\n\n)");
  std::vector<std::pair<std::string, json>> events;
  for (std::sregex_iterator it(events_text.begin(), events_text.end(), event), end; it != end; ++it)
    events.emplace_back((*it)[1], json::parse((*it)[2].str()));
  ASSERT_EQ(events.size(), 301u);
  EXPECT_EQ(events[299].second["step"], 300);
  EXPECT_EQ(events.back().first, "done");
}

TEST_F(Serve, OnStopCancelStopsTheRunningJob) {
  ServerProcess server(dir(), {"--max-steps", "10000", "--on-stop", "cancel"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const std::string running = post_json(c, "/v1/jobs", {{"prompt", "long"}, {"steps", 10000}}, 202)["id"];
  wait_status(c, running, [](const json& s) { return s["state"] == "running" && s["step"] >= 1; });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(server.terminate(), 0) << server.log();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  EXPECT_NE(server.log().find("SIGTERM: stopping (cancelling the running job)"), std::string::npos) << server.log();
}

// The memory check runs when a job starts: one that cannot fit fails alone, naming the memory,
// and the next request is served.
TEST_F(Serve, AJobThatCannotFitFailsAloneAndTheServerKeepsServing) {
  ServerProcess server(dir(), {"--device-memory", "64MiB"});
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  const json failed = post_json(c, "/v1/images/generations", {{"prompt", "too big"}, {"size", "2048x2048"}}, 422);
  EXPECT_EQ(failed["error"]["param"], "job");
  EXPECT_NE(failed["error"]["message"].get<std::string>().find("[memory] 2048x2048"), std::string::npos) << failed;
  const json ok = post_json(c, "/v1/images/generations", {{"prompt", "fits"}, {"steps", 2}}, 200);
  EXPECT_EQ(b64_png(ok), generate_png("--prompt fits --steps 2"));
  const std::string m = c.Get("/metrics")->body;
  EXPECT_NE(m.find("kiln_jobs_total{outcome=\"failed\"} 1\n"), std::string::npos) << m;
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

// A client that connects and sends nothing (or half a request) is dropped after --timeout;
// meanwhile other clients are answered at once.
TEST_F(Serve, SlowClientsTimeOutWithoutHoldingUpOthers) {
  ServerProcess server(dir(), {"--timeout", "1"});
  ASSERT_GT(server.port(), 0) << server.log();
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    const int fd = connect_loopback(server.port());
    ASSERT_GE(fd, 0);
    if (i % 2) {
      ASSERT_TRUE(send_all(fd, "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                               "Content-Length: 100\r\n\r\n{\"prompt\""));
    }
    slow.push_back(fd);
  }
  httplib::Client c = server.client();
  const auto start = std::chrono::steady_clock::now();
  const auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
  // Within a few seconds the server closes each slow connection, silently (nothing came, or the
  // body stopped short: the request did not arrive whole within --timeout); never with a job.
  for (size_t i = 0; i < slow.size(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(read_until_closed(slow[i]), "") << "connection " << i;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 9s) << "connection " << i << " was not dropped";
    ::close(slow[i]);
  }
  EXPECT_NE(c.Get("/metrics")->body.find("kiln_jobs_total{outcome=\"submitted\"} 0\n"), std::string::npos);
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

// --warmup compiles (compiled mode) before the server listens: a request at that size traces and
// compiles nothing, whatever its step count; another size does.
TEST_F(Serve, WarmupCompilesBeforeTheFirstRequest) {
  ServerProcess server(dir(), {"--mode", "compile", "--warmup", "64x128"});
  ASSERT_GT(server.port(), 0) << server.log();
  EXPECT_NE(server.log().find("kiln: warming up at 64x128"), std::string::npos) << server.log();
  httplib::Client c = server.client();
  const int traces = metric(c, "kiln_compile_total{kind=\"traces\"}");
  const int compiles = metric(c, "kiln_compile_total{kind=\"compiles\"}");
  EXPECT_GT(traces, 0);
  EXPECT_GT(compiles, 0);
  const json answer = post_json(c, "/v1/images/generations", {{"prompt", "warm"}, {"size", "128x64"}, {"steps", 3}}, 200);
  EXPECT_EQ(b64_png(answer), generate_png("--prompt warm --width 128 --height 64 --steps 3"));
  EXPECT_EQ(metric(c, "kiln_compile_total{kind=\"traces\"}"), traces);
  EXPECT_EQ(metric(c, "kiln_compile_total{kind=\"compiles\"}"), compiles);
  post_json(c, "/v1/images/generations", {{"prompt", "cold"}, {"size", "64x64"}, {"steps", 2}}, 200);
  EXPECT_GT(metric(c, "kiln_compile_total{kind=\"traces\"}"), traces);
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

// Every pipeline class generate runs is served the same way: SD3.5 (with its negative prompt and
// guidance) and FLUX.2 klein (real classifier-free guidance), each the PNG generate writes.
TEST_F(Serve, Sd35AndFlux2KleinImagesEqualGenerates) {
  struct Case {
    std::string model;
    json body;
    std::string flags;
    std::vector<std::string> serve_flags;
  };
  const fs::path fixtures = KILN_FIXTURES_DIR;
  const std::vector<Case> cases = {
      {(fixtures / "sd35_tiny_arch" / "pipeline").string(),
       {{"prompt", "a fox"}, {"negative_prompt", "blur"}, {"size", "128x128"}, {"steps", 2}, {"guidance_scale", 4.5},
        {"max_sequence_length", 40}, {"clip_skip", 1}, {"seed", 5}},
       "--prompt \"a fox\" --negative-prompt blur --width 128 --height 128 --steps 2 --guidance 4.5 "
       "--max-sequence-length 40 --clip-skip 1 --seed 5",
       {}},
      {(fixtures / "flux2_klein_tiny" / "pipeline").string(),
       {{"prompt", "a fox"}, {"size", "32x32"}, {"steps", 2}, {"guidance_scale", 4.0}, {"max_sequence_length", 48},
        {"seed", 5}},
       "--prompt \"a fox\" --width 32 --height 32 --steps 2 --guidance 4 --max-sequence-length 48 "
       "--text-encoder-out-layers 1,2,3 --seed 5",
       {"--text-encoder-out-layers", "1,2,3"}},
  };
  for (const Case& k : cases) {
    std::vector<std::string> flags = {"--model", k.model};
    flags.insert(flags.end(), k.serve_flags.begin(), k.serve_flags.end());
    ServerProcess server(dir(), flags);
    ASSERT_GT(server.port(), 0) << server.log();
    httplib::Client c = server.client();
    const json answer = post_json(c, "/v1/images/generations", k.body, 200);
    ASSERT_TRUE(answer.contains("data")) << answer;
    EXPECT_EQ(b64_png(answer), generate_png("--model " + k.model + " " + k.flags)) << k.model;
    EXPECT_EQ(server.terminate(), 0) << server.log();
  }
}

// The page at / in a real browser (Debian's chromium, headless, driven over its DevTools pipe):
// a link fills the prompt but starts nothing; the button starts the job, the page follows its
// events and shows its image, which the browser decodes. The page runs under its
// Content-Security-Policy (an inline script would not run at all).
TEST_F(Serve, ThePageShowsTheImageInHeadlessChromium) {
  ServerProcess server(dir());
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  test::HeadlessBrowser browser(dir() / "chromium");
  ASSERT_TRUE(browser.started()) << "chromium (scripts/install-deps.sh installs it) did not start";
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port()) + "/?prompt=a%20red%20fox&steps=3&submit=1";
  ASSERT_TRUE(browser.open(url)) << "chromium did not open " << url;
  const auto until = [&](const std::string& expression, const json& value) {
    json got;
    for (int i = 0; i < 600; ++i) {
      got = browser.evaluate(expression);
      if (got == value) return got;
      std::this_thread::sleep_for(100ms);
    }
    return got;
  };
  // Loaded, its script ran (the link filled the form), and no job started.
  EXPECT_EQ(until("document.readyState === 'complete' && document.getElementById('prompt').value", "a red fox"),
            "a red fox");
  EXPECT_EQ(browser.evaluate("document.getElementById('steps').value"), "3");
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(browser.evaluate("document.getElementById('status').textContent"), "idle");
  EXPECT_EQ(metric(c, "kiln_jobs_total{outcome=\"submitted\"}"), 0) << "a GET started a job";

  browser.evaluate("document.getElementById('go').click(), true");
  EXPECT_EQ(until("document.getElementById('status').textContent", "done"), "done");
  const json image = until("document.getElementById('image').dataset.loaded || ''", "128x128");
  EXPECT_EQ(image, "128x128");
  const json outer = browser.evaluate("document.getElementById('image').outerHTML");
  const std::string img = outer.is_string() ? outer.get<std::string>() : outer.dump();
  EXPECT_TRUE(std::regex_search(img, std::regex(R"(src="/v1/jobs/[0-9a-f]{16}/image")"))) << img;
  const std::string m = c.Get("/metrics")->body;
  EXPECT_NE(m.find("kiln_jobs_total{outcome=\"done\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("kiln_step_seconds_count 3\n"), std::string::npos) << m;
  EXPECT_EQ(server.terminate(), 0) << server.log();
}

// --tp 2 under mpirun: rank 0 serves, both ranks run every call. Rank 1 is given less device
// memory than rank 0, so a call that only rank 1 cannot fit must fail on both (422 naming rank
// 1's error) and leave them serving; a cancelled job stops both ranks at the same step; the images
// equal `kiln generate --tp 2`'s; SIGUSR1 to mpirun (which forwards it) ends every rank with 0.
TEST_F(Serve, TensorParallelRanksServeTogether) {
  std::vector<std::string> mpirun;
  std::istringstream words(KILN_MPIRUN_COMMAND);
  for (std::string w; words >> w;) mpirun.push_back(w);
  for (const char* a : {"-x", "KILN_CACHE_DIR", "bash", "-c",
                        R"(if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$@" --device-memory 64MiB; else exec "$@"; fi)",
                        "rank-flags"})
    mpirun.push_back(a);
  ServerProcess server(dir(), {"--tp", "2", "--max-steps", "10000"}, mpirun);
  ASSERT_GT(server.port(), 0) << server.log();
  httplib::Client c = server.client();
  EXPECT_EQ(json::parse(c.Get("/health")->body)["ranks"], 2);

  const std::string launcher = std::string(KILN_MPIRUN_COMMAND) + " -x KILN_CACHE_DIR";
  const std::string expected =
      generate_png("--tp 2 --prompt \"a red fox in the snow\" --width 128 --height 96 --steps 3 --seed 7", launcher);
  ASSERT_FALSE(expected.empty());
  const json body{{"prompt", "a red fox in the snow"}, {"size", "128x96"}, {"steps", 3}, {"seed", 7}};
  EXPECT_EQ(b64_png(post_json(c, "/v1/images/generations", body, 200)), expected);

  // Real classifier-free guidance on both ranks: generate --tp 2's image.
  EXPECT_EQ(b64_png(post_json(c, "/v1/images/generations",
                              {{"prompt", "a red fox"}, {"negative_prompt", "blurry"}, {"true_cfg_scale", 4.0},
                               {"size", "128x96"}, {"steps", 2}, {"seed", 7}},
                              200)),
            generate_png("--tp 2 --prompt \"a red fox\" --negative-prompt blurry --true-cfg-scale 4 --width 128 "
                         "--height 96 --steps 2 --seed 7",
                         launcher))
      << "true_cfg_scale";

  // Only rank 1 cannot fit 2048x2048 (64 MiB): both ranks skip the call, rank 0 reports rank 1's error.
  const json too_big = post_json(c, "/v1/images/generations", {{"prompt", "big"}, {"size", "2048x2048"}, {"steps", 1}}, 422);
  const std::string message = too_big["error"]["message"];
  EXPECT_NE(message.find("rank 1 of 2 could not start this call: [memory] 2048x2048"), std::string::npos) << message;

  // A running job cancelled: every rank stops at the same step boundary.
  const std::string running = post_json(c, "/v1/jobs", {{"prompt", "a long job"}, {"steps", 10000}}, 202)["id"];
  wait_status(c, running, [](const json& s) { return s["state"] == "running" && s["step"] >= 2; });
  ASSERT_EQ(c.Delete(("/v1/jobs/" + running).c_str())->status, 200);
  const json ended = wait_status(c, running, [](const json& s) { return s["state"] != "running"; });
  EXPECT_EQ(ended["state"], "cancelled");
  EXPECT_LT(ended["step"].get<int>(), 10000);

  // The ranks are still in step: a job's image is generate --tp 2's.
  const std::string id = post_json(c, "/v1/jobs", body, 202)["id"];
  EXPECT_EQ(wait_status(c, id, [](const json& s) { return s["state"] != "queued" && s["state"] != "running"; })["state"],
            "done");
  EXPECT_EQ(c.Get(("/v1/jobs/" + id + "/image").c_str())->body, expected);

  EXPECT_EQ(server.terminate(SIGUSR1), 0) << server.log();
  EXPECT_NE(server.log().find("SIGUSR1: stopping"), std::string::npos) << server.log();
}

}  // namespace
}  // namespace kiln
