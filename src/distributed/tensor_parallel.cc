#include "distributed/tensor_parallel.h"

#include "core/error.h"

namespace kiln {

namespace {

std::vector<std::string> segments(const std::string& path) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t dot = path.find('.', at);
    out.push_back(path.substr(at, dot == std::string::npos ? std::string::npos : dot - at));
    if (dot == std::string::npos) return out;
    at = dot + 1;
  }
}

bool matches(const std::string& pattern, const std::string& path) {
  const auto p = segments(pattern), s = segments(path);
  if (p.size() != s.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != s[i]) return false;
  return true;
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> group) : group_(std::move(group)) {
  KILN_CHECK(group_ != nullptr, "tp", "a device mesh needs a process group");
  shape_ = {group_->size()};
}

const TensorParallelEntry* ShardPlan::find(const std::string& path) const {
  for (const TensorParallelEntry& e : entries)
    if (matches(e.pattern, path)) return &e;
  return nullptr;
}

std::shared_ptr<const ShardPlan> ShardPlan::make(std::vector<TensorParallelEntry> entries, const DeviceMesh& mesh) {
  for (const TensorParallelEntry& e : entries) {
    const bool packed = e.style == "packed_colwise" || e.style == "packed_rowwise";
    KILN_CHECK(e.style == "colwise" || e.style == "rowwise" || e.style == "colwise_gather" || e.style == "vocab_parallel" ||
                   packed,
               "tp",
               "plan entry '", e.pattern, "': unknown style '", e.style,
               "' (colwise, rowwise, packed_colwise, packed_rowwise, colwise_gather)");
    KILN_CHECK(packed == !e.blocks.empty(), "tp", "plan entry '", e.pattern, "': ",
               packed ? "a packed style needs its blocks" : "only packed styles take blocks");
    for (int64_t b : e.blocks) KILN_CHECK(b > 0, "tp", "plan entry '", e.pattern, "': blocks must be positive");
  }
  auto plan = std::make_shared<ShardPlan>();
  plan->entries = std::move(entries);
  plan->group = mesh.group();
  return plan;
}

}  // namespace kiln
