#include "server/generation_request.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "pipelines/pipeline_checks.h"

namespace kiln::server {

namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& field, const std::string& message, int status = 400) {
  throw RequestError(status, field, field + ": " + message);
}

const char* type_name(const json& v) {
  return v.is_string() ? "a string" : v.is_boolean() ? "a boolean" : v.is_number() ? "a number"
         : v.is_array()  ? "an array"
         : v.is_object() ? "an object"
                         : "null";
}

std::string read_text(const json& body, const char* field, const RequestLimits& limits) {
  const json& v = body.at(field);
  if (!v.is_string()) refuse(field, std::string("expected a string, got ") + type_name(v));
  const std::string s = v.get<std::string>();
  if (s.size() > limits.max_prompt_chars)
    refuse(field, "is " + std::to_string(s.size()) + " bytes long; this server takes at most " +
                      std::to_string(limits.max_prompt_chars),
           413);
  // A NUL would fail the job's PNG text only after the whole run, and escapes would reach
  // terminals and logs: control characters other than tab and line breaks are refused here.
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    const bool c1 = ch == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
                    static_cast<unsigned char>(s[i + 1]) <= 0x9F;  // U+0080..U+009F in UTF-8
    if ((ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') || ch == 0x7F || c1) {
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", c1 ? static_cast<unsigned char>(s[i + 1]) : ch);
      refuse(field, std::string("holds the control character ") + code + " at byte " + std::to_string(i) +
                        "; only tab and line breaks are taken");
    }
  }
  return s;
}

int64_t read_int(const json& body, const char* field, int64_t lo, int64_t hi) {
  const json& v = body.at(field);
  if (!v.is_number_integer())
    refuse(field, std::string("expected an integer in [") + std::to_string(lo) + ", " + std::to_string(hi) +
                      "], got " + (v.is_number() ? v.dump() : type_name(v)));
  // Unsigned values beyond int64 read as negative here, so they fail the range check too.
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
                        ? std::numeric_limits<int64_t>::min()
                        : v.get<int64_t>();
  if (x < lo || x > hi)
    refuse(field, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return x;
}

// "1024x768" (OpenAI's WIDTHxHEIGHT) -> (height, width).
std::pair<int64_t, int64_t> read_size(const json& body, const RequestLimits& limits) {
  const json& v = body.at("size");
  // The server's --max-size, within what any call takes (serve's flag itself is not bounded above).
  const int64_t max_side = std::min(limits.max_side, pipeline_checks::kMaxSide);
  const std::string expected = "expected \"WIDTHxHEIGHT\" with sides that are multiples of 16 in [16, " +
                               std::to_string(max_side) + "]";
  if (!v.is_string()) refuse("size", expected + ", got " + type_name(v));
  const std::string s = v.get<std::string>();
  const size_t x = s.find('x');
  auto side = [&](const std::string& digits) -> int64_t {
    if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos)
      refuse("size", expected + ", got \"" + s.substr(0, 40) + "\"");
    const int64_t n = std::stoll(digits);
    if (n < 16 || n > max_side || n % 16 != 0) refuse("size", expected + ", got \"" + s + "\"");
    return n;
  };
  if (x == std::string::npos) refuse("size", expected + ", got \"" + s.substr(0, 40) + "\"");
  const int64_t width = side(s.substr(0, x)), height = side(s.substr(x + 1));
  return {height, width};
}

}  // namespace

GenerationRequest parse_generation_request(const std::string& body_text, const RequestLimits& limits,
                                           const PipelineCallArgs& defaults) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::exception& e) {  // a syntax error, or a number beyond double's range
    refuse("body", std::string("is not valid JSON (") + e.what() + ")");
  }
  if (!body.is_object()) refuse("body", std::string("expected a JSON object, got ") + type_name(body));

  // The server's own fields, then every call argument a request takes (pipelines/call_arguments.h).
  static const std::set<std::string> own = {"prompt", "n", "size", "response_format", "steps",
                                            "model", "user", "quality", "style"};
  for (const auto& [key, value] : body.items()) {
    const CallArgument* a = call_argument_named(key);
    if (!own.count(key) && !(a && a->in_requests))
      refuse(key.empty() ? "\"\"" : key.substr(0, 64), "is not a field this server takes (see docs/server.md)");
  }

  GenerationRequest r;
  r.call = defaults;
  PipelineCallArgs& c = r.call;
  if (!body.contains("prompt")) refuse("prompt", "is required");
  c.prompt = read_text(body, "prompt", limits);
  if (c.prompt.empty()) refuse("prompt", "expected a non-empty string");
  if (body.contains("n")) r.n = read_int(body, "n", 1, limits.max_n);
  if (body.contains("size")) {
    const auto [height, width] = read_size(body, limits);
    c.height = height;
    c.width = width;
    r.size_given = true;
  }
  if (body.contains("response_format")) {
    const json& v = body["response_format"];
    if (!v.is_string() || v.get<std::string>() != "b64_json")
      refuse("response_format", "expected \"b64_json\" (the image travels in the answer; a job's image is at "
                                "GET /v1/jobs/{id}/image), got " + v.dump().substr(0, 64));
  }
  if (body.contains("steps") && body.contains("num_inference_steps"))
    refuse("steps", "give steps or num_inference_steps, not both");
  for (const char* field : {"steps", "num_inference_steps"})
    if (body.contains(field))
      c.num_inference_steps = read_int(body, field, 1, std::min(limits.max_steps, pipeline_checks::kMaxSteps));
  for (const CallArgument& a : call_arguments()) {
    if (!a.in_requests || !body.contains(a.name) || a.name == std::string("prompt") ||
        a.name == std::string("num_inference_steps"))
      continue;
    const json& v = body[a.name];
    try {
      // Text arguments pass the server's own checks (length, control characters) first.
      set_from_json(c, a, v.is_string() ? json(read_text(body, a.name, limits)) : v);
    } catch (const Error& e) {
      const std::string m = e.what();  // "[pipeline] NAME: expected ..."
      refuse(a.name, m.substr(m.find(": ") + 2));
    }
  }
  for (const char* field : {"model", "user", "quality", "style"})
    if (body.contains(field) && !body[field].is_string())
      refuse(field, std::string("expected a string, got ") + type_name(body[field]));
  return r;
}

}  // namespace kiln::server
