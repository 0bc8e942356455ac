// What keeps web pages from using a `kiln serve` that has no API key. Such a server listens on
// this machine only, but any page a browser on this machine opens can still send it requests:
// a form or a `text/plain` fetch POSTs without a CORS preflight (a job queued, its image later
// read), and a DNS-rebinding page reaches it under its own host name and reads every answer.
// So, without a key:
// - the Host header must name this server (a loopback name, the address it is bound to, or a name
//   given with --allowed-hosts): a rebinding page sends its own name;
// - an Origin header, when a browser sends one, must name such a host too (a cross-site request
//   and a sandboxed page's "null" origin are refused);
// - a POST must say Content-Type: application/json, which no page can send cross-site without a
//   preflight that this server never grants.
// With a key none of this is needed: a page cannot send the key's header cross-site either.
#pragma once
#include <string>
#include <vector>

#include "server/http_server.h"

namespace kiln::server {

class BrowserGuard {
 public:
  // `bound_host`: the address or name the server listens on; `allowed`: more host names (no port).
  BrowserGuard(const std::string& bound_host, const std::vector<std::string>& allowed);

  // "" when the request may be served; otherwise which header is wrong and why (a 403's message).
  std::string refusal(const HttpRequest& request) const;
  // The header a refusal names: "Host", "Origin" or "Content-Type".
  static std::string refused_header(const std::string& refusal);

  // The host part of a Host header or an origin's authority ("[::1]:7860" -> "::1"), lowercased.
  static std::string host_name(const std::string& authority);
  bool allowed_host(const std::string& name) const;

 private:
  std::vector<std::string> hosts_;
};

}  // namespace kiln::server
