// Static attributes of an op (axes, eps, stride, ...). Kept sorted by name so that two
// equal attribute sets compare and hash the same (graph fingerprints rely on it).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace kiln {

using AttrValue = std::variant<int64_t, double, std::vector<int64_t>, std::string>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  Attrs& set(const std::string& name, AttrValue v);
  bool has(const std::string& name) const;
  int64_t get_int(const std::string& name) const;
  int64_t get_int(const std::string& name, int64_t fallback) const;
  double get_float(const std::string& name) const;
  double get_float(const std::string& name, double fallback) const;
  const std::vector<int64_t>& get_ints(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  std::string get_string(const std::string& name, const std::string& fallback) const;

  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  std::string str() const;  // "axis=1, eps=1e-06"

 private:
  const AttrValue* find(const std::string& name) const;
  const AttrValue& at(const std::string& name) const;
  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace kiln
