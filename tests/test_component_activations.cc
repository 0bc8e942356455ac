// A pipeline's activation traces are paired with its loaded components by name: traced in another
// order they still land on their own component, and a missing or unknown one is an internal error
// naming it rather than a read past the end or a wrong component's figure.
#include <gtest/gtest.h>

#include "core/error.h"
#include "pipelines/component_activations.h"

namespace kiln {
namespace {

const std::vector<std::string> kComponents{"text_encoder", "text_encoder_2", "transformer", "vae"};

TEST(ComponentActivations, TracesInAnotherOrderPairWithTheirOwnComponents) {
  ComponentActivations traced;
  traced["vae"] = 400;  // inserted last-first: the order a pipeline traces in does not matter
  traced["transformer"] = 300;
  traced["text_encoder_2"] = 200;
  traced["text_encoder"] = 100;
  EXPECT_EQ(activations_of(kComponents, traced, "FluxPipeline"), (std::vector<size_t>{100, 200, 300, 400}));
  const std::vector<std::string> reordered{"vae", "transformer", "text_encoder", "text_encoder_2"};
  EXPECT_EQ(activations_of(reordered, traced, "FluxPipeline"), (std::vector<size_t>{400, 300, 100, 200}));
}

TEST(ComponentActivations, AMissingOrUnknownTraceIsNamed) {
  const ComponentActivations missing{{"text_encoder", 1}, {"transformer", 3}, {"vae", 4}};
  try {
    activations_of(kComponents, missing, "FluxPipeline");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[pipeline] internal: FluxPipeline traced no activations for its component text_encoder_2");
  }
  ComponentActivations extra{{"text_encoder", 1}, {"text_encoder_2", 2}, {"transformer", 3}, {"vae", 4}};
  extra["text_encoder_3"] = 5;
  try {
    activations_of(kComponents, extra, "FluxPipeline");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "[pipeline] internal: FluxPipeline traced activations for text_encoder_3, which is none of its loaded "
                 "components");
  }
}

}  // namespace
}  // namespace kiln
