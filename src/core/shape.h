// Shapes, strides and broadcasting rules (NumPy semantics).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace kiln {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;  // in elements, not bytes

int64_t numel(const Shape& s);
std::string to_string(const Shape& s);  // "[2,3]"
Strides contiguous_strides(const Shape& s);
// The same addressing with a canonical stride on every size-1 dim (whose stride is never used):
// the stride that dim would have if it were packed against the next one. Views reached by
// different routes (e.g. reshape vs. a kernel's output) then compare and hash equal.
Strides canonical_unit_strides(const Shape& s, Strides strides);
// Normalises a possibly negative axis for a tensor of rank `rank`; `where` names the op in errors.
int64_t normalize_axis(int64_t axis, int64_t rank, const char* where);
// The NumPy broadcast of two shapes; throws "[where] cannot broadcast [..] with [..]".
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* where);
// Whether `s` broadcasts to exactly `to` (right-aligned dims equal or 1, rank not above).
bool broadcasts_to(const Shape& s, const Shape& to);
// Strides that read a tensor of shape `from` (with strides `strides`) as if broadcast to `to`.
Strides broadcast_strides(const Shape& from, const Strides& strides, const Shape& to);

}  // namespace kiln
