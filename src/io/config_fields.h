// Reading a config.json into the struct that holds its class defaults: each field names its key
// and the member it fills; a key that is absent or null leaves the member (the default) as it is,
// and a value of the wrong type is JsonConfig's error naming the file and the field.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "io/json_config.h"

namespace kiln::io {

// A config key bound to the member it is read into, typed as that member.
struct ConfigField {
  using Target = std::variant<int64_t*, double*, bool*, std::string*, std::vector<int64_t>*, std::optional<int64_t>*>;
  ConfigField(const char* key, int64_t& member) : key(key), target(&member) {}
  ConfigField(const char* key, double& member) : key(key), target(&member) {}
  ConfigField(const char* key, bool& member) : key(key), target(&member) {}
  ConfigField(const char* key, std::string& member) : key(key), target(&member) {}
  ConfigField(const char* key, std::vector<int64_t>& member) : key(key), target(&member) {}
  // An optional member (null in the class: "derived from another field") is set only when given.
  ConfigField(const char* key, std::optional<int64_t>& member) : key(key), target(&member) {}

  const char* key;
  Target target;
};

// Reads every field `json` has into its member, in the order given.
void read_fields(const JsonConfig& json, std::initializer_list<ConfigField> fields);

}  // namespace kiln::io
