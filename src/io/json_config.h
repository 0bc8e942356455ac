// Model and scheduler configs (diffusers-style config.json files) with typed getters whose
// errors name the file and the field, e.g.
//   [config] unet/config.json: field 'num_layers' is a string, expected an integer
// Fields are top-level keys. A field whose value is null counts as absent: diffusers writes
// null for "use the default", so has() is false and the defaulted getters return the fallback.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace kiln::io {

class JsonConfig {
 public:
  // Reads and parses `path`; errors name the path (and the line/column of bad JSON).
  explicit JsonConfig(const std::filesystem::path& path);
  // Parses JSON text; `source` stands in for the file name in errors.
  static JsonConfig from_string(const std::string& text, const std::string& source);
  // A config already parsed (one kiln writes itself); `source` stands in for the file name.
  JsonConfig(nlohmann::json j, std::string source);

  const std::string& source() const { return source_; }
  bool has(const std::string& field) const;

  int64_t get_int(const std::string& field) const;
  double get_float(const std::string& field) const;  // integers are accepted too
  bool get_bool(const std::string& field) const;
  std::string get_string(const std::string& field) const;
  std::vector<int64_t> get_int_list(const std::string& field) const;
  std::vector<std::string> get_string_list(const std::string& field) const;

  int64_t get_int(const std::string& field, int64_t fallback) const;
  double get_float(const std::string& field, double fallback) const;
  bool get_bool(const std::string& field, bool fallback) const;
  std::string get_string(const std::string& field, const std::string& fallback) const;
  std::vector<int64_t> get_int_list(const std::string& field,
                                    const std::vector<int64_t>& fallback) const;
  std::vector<std::string> get_string_list(const std::string& field,
                                           const std::vector<std::string>& fallback) const;

  const nlohmann::json& json() const { return json_; }

 private:
  const nlohmann::json& require(const std::string& field) const;
  int64_t to_int(const nlohmann::json& v, const std::string& what) const;

  nlohmann::json json_;
  std::string source_;
};

// "a string", "an integer", "a float", "an array", ... for error messages.
const char* json_kind(const nlohmann::json& j);

// Parses `text`; a syntax error becomes kiln::Error "[where] source: bad JSON at line L,
// column C: <detail>".
nlohmann::json parse_json(const char* begin, const char* end, const char* where,
                          const std::string& source);

}  // namespace kiln::io
