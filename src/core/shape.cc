#include "core/shape.h"

#include <sstream>

#include "core/error.h"

namespace kiln {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string to_string(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

Strides contiguous_strides(const Shape& s) {
  Strides st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Strides canonical_unit_strides(const Shape& s, Strides strides) {
  for (size_t i = s.size(); i-- > 0;)
    if (s[i] == 1) strides[i] = i + 1 < s.size() ? strides[i + 1] * s[i + 1] : 1;
  return strides;
}

int64_t normalize_axis(int64_t axis, int64_t rank, const char* where) {
  const int64_t a = axis < 0 ? axis + rank : axis;
  KILN_CHECK(a >= 0 && a < rank, where, "axis ", axis, " out of range for rank ", rank);
  return a;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* where) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, where, "cannot broadcast ", to_string(a), " with ",
               to_string(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

bool broadcasts_to(const Shape& s, const Shape& to) {
  if (s.size() > to.size()) return false;
  const size_t lead = to.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != 1 && s[i] != to[lead + i]) return false;
  return true;
}

Strides broadcast_strides(const Shape& from, const Strides& strides, const Shape& to) {
  Strides out(to.size(), 0);
  const size_t off = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) out[off + i] = from[i] == 1 ? 0 : strides[i];
  return out;
}

}  // namespace kiln
