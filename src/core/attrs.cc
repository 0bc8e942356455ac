#include "core/attrs.h"

#include <algorithm>
#include <sstream>

#include "core/error.h"

namespace kiln {

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (const auto& [k, v] : items) set(k, v);
}

Attrs& Attrs::set(const std::string& name, AttrValue v) {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, const std::string& n) { return item.first < n; });
  if (it != items_.end() && it->first == name) {
    it->second = std::move(v);
  } else {
    items_.insert(it, {name, std::move(v)});
  }
  return *this;
}

const AttrValue* Attrs::find(const std::string& name) const {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, const std::string& n) { return item.first < n; });
  return it != items_.end() && it->first == name ? &it->second : nullptr;
}

const AttrValue& Attrs::at(const std::string& name) const {
  const AttrValue* v = find(name);
  KILN_CHECK(v != nullptr, "attrs", "missing attribute '", name, "'");
  return *v;
}

bool Attrs::has(const std::string& name) const { return find(name) != nullptr; }

int64_t Attrs::get_int(const std::string& name) const {
  const AttrValue& v = at(name);
  KILN_CHECK(std::holds_alternative<int64_t>(v), "attrs", "attribute '", name, "' is not an integer");
  return std::get<int64_t>(v);
}
int64_t Attrs::get_int(const std::string& name, int64_t fallback) const {
  return has(name) ? get_int(name) : fallback;
}

double Attrs::get_float(const std::string& name) const {
  const AttrValue& v = at(name);
  if (std::holds_alternative<int64_t>(v)) return double(std::get<int64_t>(v));
  KILN_CHECK(std::holds_alternative<double>(v), "attrs", "attribute '", name, "' is not a number");
  return std::get<double>(v);
}
double Attrs::get_float(const std::string& name, double fallback) const {
  return has(name) ? get_float(name) : fallback;
}

const std::vector<int64_t>& Attrs::get_ints(const std::string& name) const {
  const AttrValue& v = at(name);
  KILN_CHECK(std::holds_alternative<std::vector<int64_t>>(v), "attrs", "attribute '", name,
             "' is not an integer list");
  return std::get<std::vector<int64_t>>(v);
}

const std::string& Attrs::get_string(const std::string& name) const {
  const AttrValue& v = at(name);
  KILN_CHECK(std::holds_alternative<std::string>(v), "attrs", "attribute '", name, "' is not a string");
  return std::get<std::string>(v);
}
std::string Attrs::get_string(const std::string& name, const std::string& fallback) const {
  return has(name) ? get_string(name) : fallback;
}

std::string Attrs::str() const {
  std::ostringstream os;
  bool first = true;
  for (const auto& [k, v] : items_) {
    os << (first ? "" : ", ") << k << '=';
    first = false;
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            os << '[';
            for (size_t i = 0; i < x.size(); ++i) os << (i ? "," : "") << x[i];
            os << ']';
          } else {
            os << x;
          }
        },
        v);
  }
  return os.str();
}

}  // namespace kiln
