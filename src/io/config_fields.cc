#include "io/config_fields.h"

namespace kiln::io {

namespace {

// Each member type read with the JsonConfig getter of its type, its current value the fallback.
struct ReadInto {
  const JsonConfig& json;
  const std::string key;
  void operator()(int64_t* m) const { *m = json.get_int(key, *m); }
  void operator()(double* m) const { *m = json.get_float(key, *m); }
  void operator()(bool* m) const { *m = json.get_bool(key, *m); }
  void operator()(std::string* m) const { *m = json.get_string(key, *m); }
  void operator()(std::vector<int64_t>* m) const { *m = json.get_int_list(key, *m); }
  void operator()(std::optional<int64_t>* m) const {
    if (json.has(key)) *m = json.get_int(key);
  }
};

}  // namespace

void read_fields(const JsonConfig& json, std::initializer_list<ConfigField> fields) {
  for (const ConfigField& f : fields) std::visit(ReadInto{json, f.key}, f.target);
}

}  // namespace kiln::io
