// The peak activation bytes of each model component's forward, as a pipeline traces them for its
// memory estimate: keyed by the component's name, so a pipeline may trace them in any order, and
// checked against the components it loaded, so a trace is never paired with another component.
#pragma once
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace kiln {

using ComponentActivations = std::map<std::string, size_t>;

// The activations of `components` (the loaded ones, in their order), one per name. Throws
// "[pipeline] internal: ..." naming `pipeline` and the component when one has no trace or a trace
// names no loaded component: a pipeline bug, never a silent estimate of the wrong component.
std::vector<size_t> activations_of(const std::vector<std::string>& components, const ComponentActivations& traced,
                                   const std::string& pipeline);

}  // namespace kiln
