// A program built against an installed kiln (find_package(kiln) or pkg-config): the pipeline
// the bundled checkpoint's model_index.json names, called as `kiln generate` calls it without
// --model, its image written as a PNG.
//
//   generate_bundled OUT.png
#include <cstdio>
#include <exception>

#include "io/kiln_files.h"
#include "io/png.h"
#include "pipelines/diffusion_pipeline.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.png\n", argv[0]);
    return 2;
  }
  try {
    const auto pipe = kiln::DiffusionPipeline::from_pretrained(kiln::io::bundled_model_dir());
    kiln::PipelineCallArgs call;
    call.prompt = "A painting of a squirrel eating a burger";
    call.height = call.width = 128;
    call.num_inference_steps = 4;
    call.max_sequence_length = 32;
    call.seed = 0;
    const kiln::PipelineOutput out = (*pipe)(call);
    kiln::io::write_png(argv[1], out.image.data(), out.height, out.width);
    std::printf("%s: %lldx%lld, %s\n", argv[1], static_cast<long long>(out.height),
                static_cast<long long>(out.width), pipe->class_name());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "generate_bundled: %s\n", e.what());
    return 1;
  }
  return 0;
}
