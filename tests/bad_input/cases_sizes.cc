// Bad-input corpus: sizes that would exhaust host or device memory.
//
// A size the host cannot hold fails from a closed-form floor before anything is allocated; a
// size or capacity the estimate says cannot fit fails before any work, with the numbers per
// component and what would fit instead. All on the tiny model, so each case returns at once.
#include <string>
#include <utility>
#include <vector>

#include "corpus.h"

namespace kiln::corpus {

namespace {

// A case failing with the message's key words, before any image is written.
Case fails(std::string name, std::vector<std::string> args, std::vector<std::string> expect) {
  return failing(std::move(name), std::move(args), std::move(expect), {}, {"encoded the prompts", "wrote "});
}

}  // namespace

void add_size_cases(Corpus& corpus) {
  const auto gen = [&](std::vector<std::string> extra) {
    return corpus.generate(corpus.tiny_model(), std::move(extra));
  };

  // Host memory: 642 GiB of noise, latents, position tables and image alone (the floor).
  corpus.add(fails("sizes/100000x100000-host-floor", gen({"--height", "100000", "--width", "100000"}),
                   {"[memory] 100000x100000 needs at least", "of memory for its noise, latents, position tables",
                    "choose a smaller --height/--width"}));
  // 103 GiB for the floor: more than most machines have; past the floor, the full estimate
  // (also against the host's available memory) refuses it.
  corpus.add(fails("sizes/40000x40000-host", gen({"--height", "40000", "--width", "40000"}),
                   {"[memory] 40000x40000 needs", "available"}));
  // Past the largest side kiln accepts (2^20): refused with the flag, before the model loads.
  corpus.add(fails("sizes/height-2000000", gen({"--height", "2000000"}),
                   {"[cli] --height must be at most 1048576, got 2000000"}));

  // Device capacity: 1 byte fits nothing.
  corpus.add(fails(
      "sizes/device-memory-1-byte", gen({"--device-memory", "1"}),
      {"[memory] 32x32 with the weights read in place from the host needs", "of device memory but the capacity is 1 B",
       "text_encoder", "transformer", "vae", "nothing smaller fits either: raise --device-memory"}));
  // 1 MiB with model offload: 32x32 does not fit, a smaller size does.
  corpus.add(fails("sizes/device-memory-1MiB-offload-model", gen({"--device-memory", "1MiB", "--offload", "model"}),
                   {"[memory] 32x32 with model offload needs", "the capacity is 1.00 MiB", "would fit: 16x16 needs"}));
  // 100 KiB with model offload: smaller than a text encoder's weights, so no size fits.
  corpus.add(fails("sizes/device-memory-100KiB-offload-model", gen({"--device-memory", "100KiB", "--offload", "model"}),
                   {"[memory] 32x32 with model offload needs", "the capacity is 100.00 KiB",
                    "nothing smaller fits either: raise --device-memory"}));
}

}  // namespace kiln::corpus
