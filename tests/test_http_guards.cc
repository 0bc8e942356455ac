// kiln serve's checks that need no server: which requests a server without an API key refuses
// as coming from other web pages (server/browser_guard.h), and how paths leave error messages
// (server/redact_paths.h).
#include <gtest/gtest.h>

#include "server/browser_guard.h"
#include "server/redact_paths.h"

namespace kiln::server {
namespace {

HttpRequest request(const std::string& method, std::vector<std::pair<std::string, std::string>> headers) {
  HttpRequest r;
  r.method = method;
  r.path = "/v1/jobs";
  r.headers = std::move(headers);
  return r;
}

TEST(BrowserGuard, HostNamesAreParsedAsBrowsersSendThem) {
  EXPECT_EQ(BrowserGuard::host_name("127.0.0.1:7860"), "127.0.0.1");
  EXPECT_EQ(BrowserGuard::host_name("LocalHost."), "localhost");
  EXPECT_EQ(BrowserGuard::host_name("[::1]:7860"), "::1");
  EXPECT_EQ(BrowserGuard::host_name("evil.example:80"), "evil.example");
}

TEST(BrowserGuard, OnlyThisServersOwnNamesAndPageAreAnswered) {
  const BrowserGuard guard("127.0.0.1", {"kiln.lan"});
  const auto json_post = [](std::vector<std::pair<std::string, std::string>> h) {
    h.emplace_back("Content-Type", "application/json; charset=utf-8");
    return request("POST", std::move(h));
  };
  // Programs on this machine and the server's own page.
  EXPECT_EQ(guard.refusal(json_post({{"Host", "127.0.0.1:7860"}})), "");
  EXPECT_EQ(guard.refusal(json_post({{"Host", "localhost:7860"}, {"Origin", "http://localhost:7860"}})), "");
  EXPECT_EQ(guard.refusal(json_post({{"host", "[::1]:7860"}})), "");
  EXPECT_EQ(guard.refusal(json_post({{"Host", "kiln.lan:7860"}, {"Origin", "http://kiln.lan:7860"}})), "");
  EXPECT_EQ(guard.refusal(json_post({})), "");  // HTTP/1.0 without Host: not a browser
  EXPECT_EQ(guard.refusal(request("GET", {{"Host", "127.0.0.1"}})), "");
  // A DNS-rebinding page: its own name in Host.
  EXPECT_EQ(BrowserGuard::refused_header(guard.refusal(request("GET", {{"Host", "evil.example:7860"}}))), "Host");
  // Another site's page, and a sandboxed one.
  for (const char* origin : {"http://evil.example", "null", "http://127.0.0.1.evil.example:7860", "file://"})
    EXPECT_EQ(BrowserGuard::refused_header(
                  guard.refusal(json_post({{"Host", "127.0.0.1:7860"}, {"Origin", origin}}))),
              "Origin")
        << origin;
  // A POST a form or a no-preflight fetch can send.
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", ""})
    EXPECT_EQ(BrowserGuard::refused_header(
                  guard.refusal(request("POST", {{"Host", "127.0.0.1:7860"}, {"Content-Type", type}}))),
              "Content-Type")
        << type;
}

TEST(RedactPaths, NoPathOfTheServerReachesAClient) {
  const std::string message =
      "[load] /srv/models/FLUX.1-schnell/transformer/diffusion_pytorch_model.safetensors: tensor 'x' is "
      "truncated; cache '/home/kiln/.cache/kiln/executables/abc.bin' (see docs/errors.md), url http://h/a/b.";
  const std::string redacted = redact_paths(message, "/srv/models/FLUX.1-schnell/", "FLUX.1-schnell");
  EXPECT_EQ(redacted,
            "[load] FLUX.1-schnell/transformer/diffusion_pytorch_model.safetensors: tensor 'x' is truncated; cache "
            "'.../abc.bin' (see docs/errors.md), url http://h/a/b.");
  EXPECT_EQ(redact_paths("[memory] 2048x2048 needs 9 GiB", "/m", "m"), "[memory] 2048x2048 needs 9 GiB");
  EXPECT_EQ(redact_paths("/etc/passwd: not a model", "/m", "m"), ".../passwd: not a model");
}

}  // namespace
}  // namespace kiln::server
