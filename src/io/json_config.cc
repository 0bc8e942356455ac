#include "io/json_config.h"

#include <limits>

#include "core/error.h"
#include "io/input_file.h"

namespace kiln::io {
namespace {

constexpr const char* kWhere = "config";

// nlohmann messages start with "[json.exception.parse_error.101] parse error at line 1,
// column 5: "; the position is reported separately, so keep only the explanation.
std::string json_detail(const char* what) {
  const std::string s = what;
  const size_t tag = s.find("] ");
  if (tag == std::string::npos) return s;
  const size_t colon = s.find(": ", tag);
  return colon == std::string::npos ? s.substr(tag + 2) : s.substr(colon + 2);
}

// Line and column (1-based) of the byte at `offset` in [begin, end).
std::pair<size_t, size_t> line_column(const char* begin, const char* end, size_t offset) {
  size_t line = 1, column = 1;
  for (const char* p = begin; p < end && size_t(p - begin) < offset; ++p) {
    if (*p == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

}  // namespace

const char* json_kind(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::object: return "an object";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: return "an integer";
    case nlohmann::json::value_t::number_float: return "a float";
    case nlohmann::json::value_t::binary: return "binary data";
    case nlohmann::json::value_t::discarded: return "discarded";
  }
  return "unknown";
}

nlohmann::json parse_json(const char* begin, const char* end, const char* where,
                          const std::string& source) {
  try {
    return nlohmann::json::parse(begin, end);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts the bytes read, so the offending byte is the one before it.
    const size_t offset = e.byte > 0 ? e.byte - 1 : 0;
    const auto [line, column] = line_column(begin, end, offset);
    fail(where, source, ": bad JSON at line ", line, ", column ", column, " (byte ", offset,
         "): ", json_detail(e.what()));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
    fail(where, source, ": bad JSON: ", json_detail(e.what()));
  }
}

JsonConfig::JsonConfig(nlohmann::json j, std::string source)
    : json_(std::move(j)), source_(std::move(source)) {
  KILN_CHECK(json_.is_object(), kWhere, source_, ": top level is ", json_kind(json_),
             ", expected an object");
}

JsonConfig::JsonConfig(const std::filesystem::path& path) {
  std::error_code ec;
  KILN_CHECK(std::filesystem::exists(path, ec), kWhere, path.string(), ": config file not found");
  // A FIFO, socket, device or folder is refused without a blocking open (io/input_file.h).
  const std::string s = read_input_file(kWhere, path, "a JSON config file");
  *this =
      JsonConfig(parse_json(s.data(), s.data() + s.size(), kWhere, path.string()), path.string());
}

JsonConfig JsonConfig::from_string(const std::string& text, const std::string& source) {
  return JsonConfig(parse_json(text.data(), text.data() + text.size(), kWhere, source), source);
}

bool JsonConfig::has(const std::string& field) const {
  const auto it = json_.find(field);
  return it != json_.end() && !it->is_null();
}

const nlohmann::json& JsonConfig::require(const std::string& field) const {
  KILN_CHECK(has(field), kWhere, source_, ": missing field '", field, "'");
  return json_.at(field);
}

int64_t JsonConfig::to_int(const nlohmann::json& v, const std::string& what) const {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    KILN_CHECK(u <= uint64_t(std::numeric_limits<int64_t>::max()), kWhere, source_, ": ", what,
               " = ", u, " is too large for a 64-bit integer");
    return int64_t(u);
  }
  KILN_CHECK(v.is_number_integer(), kWhere, source_, ": ", what, " is ", json_kind(v),
             ", expected an integer");
  return v.get<int64_t>();
}

int64_t JsonConfig::get_int(const std::string& field) const {
  return to_int(require(field), "field '" + field + "'");
}

double JsonConfig::get_float(const std::string& field) const {
  const nlohmann::json& v = require(field);
  KILN_CHECK(v.is_number(), kWhere, source_, ": field '", field, "' is ", json_kind(v),
             ", expected a number");
  return v.get<double>();
}

bool JsonConfig::get_bool(const std::string& field) const {
  const nlohmann::json& v = require(field);
  KILN_CHECK(v.is_boolean(), kWhere, source_, ": field '", field, "' is ", json_kind(v),
             ", expected a boolean");
  return v.get<bool>();
}

std::string JsonConfig::get_string(const std::string& field) const {
  const nlohmann::json& v = require(field);
  KILN_CHECK(v.is_string(), kWhere, source_, ": field '", field, "' is ", json_kind(v),
             ", expected a string");
  return v.get<std::string>();
}

std::vector<int64_t> JsonConfig::get_int_list(const std::string& field) const {
  const nlohmann::json& v = require(field);
  KILN_CHECK(v.is_array(), kWhere, source_, ": field '", field, "' is ", json_kind(v),
             ", expected a list of integers");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(to_int(v[i], "field '" + field + "' element " + std::to_string(i)));
  return out;
}

std::vector<std::string> JsonConfig::get_string_list(const std::string& field) const {
  const nlohmann::json& v = require(field);
  KILN_CHECK(v.is_array(), kWhere, source_, ": field '", field, "' is ", json_kind(v), ", expected a list of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    KILN_CHECK(v[i].is_string(), kWhere, source_, ": field '", field, "' element ", i, " is ", json_kind(v[i]),
               ", expected a string");
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

int64_t JsonConfig::get_int(const std::string& field, int64_t fallback) const {
  return has(field) ? get_int(field) : fallback;
}

double JsonConfig::get_float(const std::string& field, double fallback) const {
  return has(field) ? get_float(field) : fallback;
}

bool JsonConfig::get_bool(const std::string& field, bool fallback) const {
  return has(field) ? get_bool(field) : fallback;
}

std::string JsonConfig::get_string(const std::string& field, const std::string& fallback) const {
  return has(field) ? get_string(field) : fallback;
}

std::vector<int64_t> JsonConfig::get_int_list(const std::string& field,
                                              const std::vector<int64_t>& fallback) const {
  return has(field) ? get_int_list(field) : fallback;
}

std::vector<std::string> JsonConfig::get_string_list(const std::string& field,
                                                     const std::vector<std::string>& fallback) const {
  return has(field) ? get_string_list(field) : fallback;
}

}  // namespace kiln::io
