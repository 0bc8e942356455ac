// Launch merging after partition (graph/fusion.h): chains with in-place row ops and elementwise
// epilogues, concat elimination, concats of adjacent views. Internal to graph/fusion.cc.
#pragma once
#include <vector>

#include "graph/fusion.h"

namespace kiln {

// `consumers[v]`: distinct nodes reading value v; `is_out[v]`: v is a graph output.
void merge_launches(const Graph& g, std::vector<LaunchGroup>& groups,
                    const std::vector<std::vector<int>>& consumers, const std::vector<char>& is_out,
                    bool whole_row_tiles);

}  // namespace kiln
