#include "pipelines/component_activations.h"

#include "core/error.h"

namespace kiln {

std::vector<size_t> activations_of(const std::vector<std::string>& components, const ComponentActivations& traced,
                                   const std::string& pipeline) {
  std::vector<size_t> out;
  for (const std::string& name : components) {
    const auto it = traced.find(name);
    KILN_CHECK(it != traced.end(), "pipeline", "internal: ", pipeline, " traced no activations for its component ",
               name);
    out.push_back(it->second);
  }
  for (const auto& [name, bytes] : traced) {
    bool loaded = false;
    for (const std::string& c : components) loaded = loaded || c == name;
    KILN_CHECK(loaded, "pipeline", "internal: ", pipeline, " traced activations for ", name,
               ", which is none of its loaded components");
  }
  return out;
}

}  // namespace kiln
