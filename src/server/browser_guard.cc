#include "server/browser_guard.h"

#include <algorithm>
#include <cctype>

namespace kiln::server {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

// "application/json; charset=utf-8" -> "application/json".
std::string media_type(const std::string& content_type) {
  std::string type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.erase(type.begin());
  return lower(type);
}

}  // namespace

BrowserGuard::BrowserGuard(const std::string& bound_host, const std::vector<std::string>& allowed)
    : hosts_{"localhost", "127.0.0.1", "::1", host_name(bound_host)} {
  for (const std::string& h : allowed) hosts_.push_back(host_name(h));
}

std::string BrowserGuard::host_name(const std::string& authority) {
  std::string a = lower(authority);
  if (!a.empty() && a.front() == '[') {  // an IPv6 literal: "[::1]:7860"
    const size_t close = a.find(']');
    return close == std::string::npos ? a : a.substr(1, close - 1);
  }
  if (std::count(a.begin(), a.end(), ':') == 1) a = a.substr(0, a.find(':'));
  if (!a.empty() && a.back() == '.') a.pop_back();  // "localhost." names the same host
  return a;
}

bool BrowserGuard::allowed_host(const std::string& name) const {
  return !name.empty() && std::find(hosts_.begin(), hosts_.end(), name) != hosts_.end();
}

std::string BrowserGuard::refusal(const HttpRequest& r) const {
  // HTTP/1.0 clients may send no Host; a browser always sends one.
  if (r.has_header("Host") && !allowed_host(host_name(r.header("Host"))))
    return "Host: '" + r.header("Host").substr(0, 100) +
           "' does not name this server (a loopback name, its address, or one given with --allowed-hosts); "
           "without --api-key only those are answered";
  if (r.has_header("Origin")) {
    const std::string origin = lower(r.header("Origin"));
    const size_t scheme = origin.find("://");
    const bool ok = (origin.rfind("http://", 0) == 0 || origin.rfind("https://", 0) == 0) &&
                    allowed_host(host_name(origin.substr(scheme + 3, origin.find('/', scheme + 3) - scheme - 3)));
    if (!ok)
      return "Origin: '" + r.header("Origin").substr(0, 100) +
             "' is another site; without --api-key only this server's own page may call it";
  }
  if (r.method == "POST" && media_type(r.header("Content-Type")) != "application/json")
    return "Content-Type: expected application/json for a POST, got '" + r.header("Content-Type").substr(0, 100) +
           "' (without --api-key the server takes no form or text bodies, which any web page can send)";
  return "";
}

std::string BrowserGuard::refused_header(const std::string& refusal) {
  return refusal.substr(0, refusal.find(':'));
}

}  // namespace kiln::server
