// What each model class kiln make-random can write reads, from its config.json: the model the
// config names ("_class_name" for Diffusers, "architectures" for transformers) is built over a
// recording source (model_reads.h), with the few drawing rules its family changes. A new model
// family registers its classes here, once.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "random_checkpoint/random_component.h"

namespace kiln::random_weights {

// The class a component's config.json names, or "" when it names none.
std::string config_class(const nlohmann::json& config);

// The tensors the model `config` names reads, in the order it reads them; an error naming
// `folder` when kiln has no such model class.
std::vector<RandomTensor> component_tensors(const std::string& folder, const nlohmann::json& config);

}  // namespace kiln::random_weights
