#include "distributed/same_arguments.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace kiln {

namespace {

// An argument as a message shows it: quoted, a long prompt cut to its start, or "(none)" for
// one a shorter command line lacks.
std::string shown(const std::vector<std::string>& args, size_t i) {
  if (i >= args.size()) return "(none)";
  const std::string& a = args[i];
  return "'" + (a.size() > 60 ? a.substr(0, 60) + "..." : a) + "'";
}

}  // namespace

void check_same_arguments(ProcessGroup& group, const std::string& command, const std::vector<std::string>& all_args,
                          const std::vector<std::string>& per_rank_flags) {
  const int n = group.size();
  if (n == 1) return;
  // A rank's own settings (its device's memory) may differ: each such flag and its value are left
  // out of the comparison.
  std::vector<std::string> args;
  for (size_t i = 0; i < all_args.size(); ++i) {
    if (std::find(per_rank_flags.begin(), per_rank_flags.end(), all_args[i]) != per_rank_flags.end()) {
      ++i;
      continue;
    }
    args.push_back(all_args[i]);
  }
  // Each rank's command line after "kiln" as one buffer, each argument ended by '\0' (which no
  // argv string holds).
  std::string mine = command + '\0';
  for (const std::string& a : args) mine.append(a).push_back('\0');
  const uint64_t my_size = mine.size();
  std::vector<uint64_t> sizes(static_cast<size_t>(n));
  group.all_gather(&my_size, sizes.data(), sizeof my_size);
  const uint64_t most = *std::max_element(sizes.begin(), sizes.end());
  mine.resize(size_t(most), '\0');
  std::string all(size_t(most) * size_t(n), '\0');
  group.all_gather(mine.data(), all.data(), size_t(most));
  std::vector<std::vector<std::string>> lists(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (size_t pos = size_t(most) * size_t(r), end = pos + size_t(sizes[size_t(r)]); pos < end;) {
      const size_t zero = all.find('\0', pos);
      lists[size_t(r)].push_back(all.substr(pos, zero - pos));
      pos = zero + 1;
    }
  // Every rank reaches the same verdict and message from the same gathered lists.
  std::vector<int> differ;
  for (int r = 1; r < n; ++r)
    if (lists[size_t(r)] != lists[0]) differ.push_back(r);
  if (differ.empty()) return;
  const std::vector<std::string>& first = lists[0];
  const std::vector<std::string>& other = lists[size_t(differ[0])];
  size_t i = 0;
  while (i < first.size() && i < other.size() && first[i] == other[i]) ++i;
  std::string ranks;
  for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  // Argument i + 1 of "kiln ...": the command is argument 1.
  fail("distributed", "the ranks were launched with different arguments: argument ", i + 1,
       i > 0 ? " (after " + shown(first, i - 1) + ")" : std::string(), " is ", shown(other, i), " on rank ",
       differ[0], " but ", shown(first, i), " on rank 0 (ranks that differ from rank 0: ", ranks, " of ", n,
       "); every rank of a --tp job must run the same kiln ", first[0], " command line");
}

}  // namespace kiln
