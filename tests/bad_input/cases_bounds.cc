// Bad-input corpus: values bounded before any work (issue 37, "every input bounded before
// work").
//
// Each of these used to start work in proportion to the value before anything said no: --steps
// 2147483648 allocated 23.7 GB for its schedule, a 30000x30000 plan traced 390,000 VAE tiles for
// minutes, make-random --blocks 1000000+1 ran out of memory describing its tensors, a small PNG
// declaring 30000x30000 took 2.65 GB to compare, and --vae-tile-size 16 silently wrote a 92x92
// image for 64x64. Now each fails with one line naming the flag and what it takes, within the
// runner's --fast-timeout (Case::fast), with nothing written.
#include <array>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "corpus.h"

namespace kiln::corpus {

namespace {

// A case that fails fast (before any work) with the message's key words and writes nothing.
Case bounded(std::string name, std::vector<std::string> args, std::vector<std::string> expect,
             std::vector<std::string> env = {}) {
  Case c = failing(std::move(name), std::move(args), std::move(expect), std::move(env),
                   {"encoded the prompts", "wrote ", "kiln: writing"});
  c.fast = true;
  return c;
}

// The PNG chunk CRC (ISO 3309, as zlib's crc32).
uint32_t crc32(const std::string& bytes) {
  uint32_t c = 0xffffffffu;
  for (const char ch : bytes) {
    c ^= static_cast<unsigned char>(ch);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return c ^ 0xffffffffu;
}

std::string big_endian(uint32_t v) {
  return {char(v >> 24), char((v >> 16) & 0xff), char((v >> 8) & 0xff), char(v & 0xff)};
}

std::string chunk(const std::string& type, const std::string& data) {
  return big_endian(uint32_t(data.size())) + type + data + big_endian(crc32(type + data));
}

// A PNG whose header declares height x width 8-bit RGB pixels, with the first bytes of a zlib
// stream and no more: a decoder that trusts the header allocates the whole image first.
void write_declared_png(const fs::path& file, uint32_t height, uint32_t width) {
  const std::string ihdr = big_endian(width) + big_endian(height) + std::string{8, 2, 0, 0, 0};
  const std::string idat{char(0x78), char(0x9c), 0, 0, 0, 0};
  std::ofstream(file, std::ios::binary) << std::string("\x89PNG\r\n\x1a\n", 8) << chunk("IHDR", ihdr)
                                        << chunk("IDAT", idat) << chunk("IEND", "");
}

}  // namespace

void add_bound_cases(Corpus& corpus) {
  const auto gen = [&](std::vector<std::string> extra) {
    return corpus.generate(corpus.tiny_model(), std::move(extra));
  };

  // --steps: the schedule holds a value per step; 2^31 steps were 23.7 GB, 2^63-1 a
  // "cannot create std::vector larger than max_size()".
  for (const char* steps : {"2147483648", "9223372036854775807", "10001"})
    corpus.add(bounded(std::string("bounds/steps-") + steps, gen({"--steps", steps}),
                       {"[cli] --steps must be at most 10000", std::string("got ") + steps}));

  // --height / --width: refused by the CLI, before the model loads.
  corpus.add(bounded("bounds/width-2000000", gen({"--width", "2000000"}),
                     {"[cli] --width must be at most 1048576, got 2000000"}));

  // --vae-tile-size: 0 and negative sizes are not tiles (0 used to mean the default silently).
  for (const auto& [tile, bound] : {std::pair{"0", "at least 1"}, {"-64", "at least 1"}, {"2097152", "at most 1048576"}})
    corpus.add(bounded(std::string("bounds/vae-tile-size-") + tile, gen({"--vae-tile-size", tile}),
                       {std::string("[cli] --vae-tile-size must be ") + bound + ", got " + tile}));
  // Tiles that would change the image's size (no final crop in Diffusers' tiled decode: 16-pixel
  // tiles made 64x64 into 92x92) or are not whole latent pixels, on the bundled VAE (8x).
  for (const char* tile : {"16", "40", "36"})
    corpus.add(bounded(std::string("bounds/vae-tile-size-") + tile + "-arch",
                       corpus.generate(corpus.arch_model(), {"--height", "64", "--width", "64", "--vae-tiling", "on",
                                                             "--vae-tile-size", tile}),
                       {std::string("[pipeline] vae_tile_size (--vae-tile-size) is ") + tile,
                        "expected a multiple of 32 from 32 to 1048576"}));

  // The memory plan at 30000x30000 with tiles (the default --vae-tiling auto, when the untiled
  // decode does not fit): 390,000 tiles of the bundled VAE used to be traced one by one. The
  // capacity stands in for a machine's memory, so the case is the same on any machine.
  corpus.add(bounded("bounds/plan-30000x30000-tiled",
                     corpus.generate(corpus.arch_model(), {"--height", "30000", "--width", "30000",
                                                           "--device-memory", "4GiB"}),
                     {"[memory] 30000x30000 with the weights read in place from the host needs",
                      "the capacity is 4.00 GiB", "vae "},
                     {"KILN_HOST_MEMORY_CHECK=0"}));

  // The largest side there is, planned without the host check: the plan's placeholder latents
  // and activations are terabytes, which used to be allocated ("internal error: std::bad_alloc").
  corpus.add(bounded("bounds/plan-1048576x1048576",
                     corpus.generate(corpus.arch_model(), {"--height", "1048576", "--width", "1048576",
                                                           "--device-memory", "4GiB"}),
                     {"[memory] 1048576x1048576 with the weights read in place from the host needs",
                      "the capacity is 4.00 GiB"},
                     {"KILN_HOST_MEMORY_CHECK=0"}));

  // warmup --sizes: each side bounded as generate's, and the list's length.
  corpus.add(bounded("bounds/warmup-side-2000000", {"warmup", "--sizes", "2000000x32"},
                     {"[cli] --sizes: 2000000x32 has a side above 1048576"}, {"KILN_CACHE_DIR=none"}));
  {
    std::string many = "32x32";
    for (int i = 0; i < 256; ++i) many += ",32x32";
    corpus.add(bounded("bounds/warmup-257-sizes", {"warmup", "--sizes", many},
                       {"[cli] --sizes lists more than 256 sizes"}, {"KILN_CACHE_DIR=none"}));
  }

  // make-random: each stack's count, before a tensor is described (a million blocks ran out of
  // memory first). The folder it would write is in the watched out_dir.
  const std::string dir = (corpus.out_dir() / "random").string();
  corpus.add(bounded("bounds/make-random-blocks-1000000+1",
                     {"make-random", dir, "--like", "flux1-schnell", "--blocks", "1000000+1"},
                     {"[cli] --blocks 1000000+1: at most 1000 blocks each"}));
  corpus.add(bounded("bounds/make-random-sd3-blocks-5000", {"make-random", dir, "--like", "sd3-medium", "--blocks", "5000"},
                     {"[cli] --blocks 5000: at most 1000 transformer blocks"}));
  corpus.add(bounded("bounds/make-random-t5-layers", {"make-random", dir, "--like", "flux1-dev", "--t5-layers", "1000000"},
                     {"[cli] --t5-layers 1000000: at most 1000 T5 layers"}));
  corpus.add(bounded("bounds/make-random-text-encoder-layers",
                     {"make-random", dir, "--like", "flux2-klein-4b", "--text-encoder-layers", "1000000"},
                     {"[cli] --text-encoder-layers 1000000: at most 1000 text encoder layers"}));

  // compare: a PNG declaring 30000x30000 (a few bytes here; 2.6 MB when its pixels are all one
  // colour) is refused from its header, before 2.7 GB of pixels are allocated.
  {
    const fs::path dir_png = corpus.scratch() / "bounds_png";
    fs::create_directories(dir_png);
    const fs::path big = dir_png / "declares_30000x30000.png";
    write_declared_png(big, 30000, 30000);
    Case c = bounded("bounds/compare-png-declares-30000x30000", {"compare", big.string(), big.string()},
                     {"[png] cannot read " + big.string(), "it declares 30000x30000 pixels (HxW)",
                      "expected at most 268435456 pixels"});
    corpus.add(std::move(c));
  }
}

}  // namespace kiln::corpus
