// Bad-input corpus: input files that are not regular files. A FIFO where kiln reads a file used to
// hang the run forever (open() waits for a writer); now every reader refuses a FIFO, socket,
// device or folder at once, with one line naming the flag or file, what it is and what was
// expected (io/input_file.h). Each case ends well within a second. Also: a GGUF file is read as
// GGUF whatever its name.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>

#include "corpus.h"

namespace kiln::corpus {

namespace {

// Replaces `file` (a link or a copy in a sparse model) by a FIFO.
void make_fifo(const fs::path& file) {
  fs::remove(file);
  ::mkfifo(file.c_str(), 0644);
}

void put_u32(std::string& s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s += char((v >> (8 * i)) & 0xff);
}
void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; ++i) s += char((v >> (8 * i)) & 0xff);
}

// The safetensors file `from` (F32, F16 or BF16 tensors) rewritten as a GGUF file (version 3, no
// metadata, alignment 32) at `to`, whatever `to`'s name: the same tensors under the same names.
void write_as_gguf(const fs::path& from, const fs::path& to) {
  const auto [header, data] = Corpus::read_safetensors(from);
  std::string infos, body;
  uint64_t count = 0;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string dtype = t.at("dtype");
    const uint32_t type = dtype == "F32" ? 0 : dtype == "F16" ? 1 : 30;  // ggml F32, F16, BF16
    const auto offsets = t.at("data_offsets");
    const size_t begin = offsets[0], end = offsets[1];
    body.append((32 - body.size() % 32) % 32, '\0');
    put_u64(infos, name.size());
    infos += name;
    const auto shape = t.at("shape");
    put_u32(infos, uint32_t(shape.size()));
    for (size_t i = shape.size(); i-- > 0;) put_u64(infos, shape[i].get<uint64_t>());  // innermost first
    put_u32(infos, type);
    put_u64(infos, body.size());
    body += data.substr(begin, end - begin);
    ++count;
  }
  std::string out = "GGUF";
  put_u32(out, 3);
  put_u64(out, count);
  put_u64(out, 0);  // no metadata
  out += infos;
  out.append((32 - out.size() % 32) % 32, '\0');
  std::ofstream(to, std::ios::binary | std::ios::trunc) << out << body;
}

}  // namespace

void add_input_cases(Corpus& corpus) {
  const fs::path dir = corpus.scratch() / "inputs";
  fs::create_directories(dir / "folder.safetensors");
  const fs::path fifo = dir / "pipe.safetensors", png_fifo = dir / "pipe.png";
  ::mkfifo(fifo.c_str(), 0644);
  ::mkfifo(png_fifo.c_str(), 0644);
  const fs::path folder = dir / "folder.safetensors";
  const auto gen = [&](std::vector<std::string> extra) {
    return corpus.generate(corpus.tiny_model(), std::move(extra));
  };
  const std::string fifo_kind = "is a FIFO, not a regular file";

  // The transformer's weights in the model folder: generate and inspect.
  const fs::path m = corpus.sparse_copy("fifo_transformer", {});
  const fs::path weights = m / "transformer" / "diffusion_pytorch_model.safetensors";
  make_fifo(weights);
  corpus.add(failing("inputs/generate-transformer-weights-fifo", corpus.generate(m),
                     {"[safetensors] " + weights.string() + ": it " + fifo_kind, "expected a safetensors file"}));
  corpus.add(failing("inputs/inspect-transformer-weights-fifo", {"inspect", "--model", m.string()},
                     {"[safetensors] " + weights.string() + ": it " + fifo_kind}));

  // A config and a tokenizer file (refused before as "not found (or not a regular file)").
  const fs::path c = corpus.sparse_copy("fifo_config", {});
  make_fifo(c / "transformer" / "config.json");
  corpus.add(failing("inputs/config-fifo", corpus.generate(c),
                     {"[config] " + (c / "transformer" / "config.json").string() + " " + fifo_kind,
                      "expected a JSON config file"}));
  const fs::path t = corpus.sparse_copy("fifo_tokenizer", {});
  make_fifo(t / "tokenizer" / "vocab.json");
  corpus.add(failing("inputs/tokenizer-fifo", corpus.generate(t),
                     {"[tokenizer] " + (t / "tokenizer" / "vocab.json").string() + " " + fifo_kind}));

  // --latents.
  corpus.add(failing("inputs/latents-fifo", gen({"--latents", fifo.string()}),
                     {"[cli] --latents " + fifo.string() + " " + fifo_kind, "expected a safetensors file"}));
  corpus.add(failing("inputs/latents-folder", gen({"--latents", folder.string()}),
                     {"--latents " + folder.string() + " is a folder, not a regular file"}));
  corpus.add(failing("inputs/latents-char-device", gen({"--latents", "/dev/zero"}),
                     {"--latents /dev/zero is a character device, not a regular file"}));

  // The component-file flags (they said "does not exist" of a folder or a FIFO).
  corpus.add(failing("inputs/transformer-flag-folder", gen({"--transformer", folder.string()}),
                     {"checkpoint file for transformer (" + folder.string() + ") is a folder, not a regular file",
                      "expected a safetensors or GGUF file"}));
  corpus.add(failing("inputs/transformer-flag-fifo", gen({"--transformer", fifo.string()}),
                     {"checkpoint file for transformer (" + fifo.string() + ") " + fifo_kind}));
  corpus.add(failing("inputs/vae-flag-char-device", gen({"--vae", "/dev/zero"}),
                     {"checkpoint file for vae (/dev/zero) is a character device"}));
  corpus.add(failing("inputs/text-encoder-2-flag-fifo", gen({"--text-encoder-2", fifo.string()}),
                     {"checkpoint file for text_encoder_2 (" + fifo.string() + ") " + fifo_kind}));

  // kiln compare's PNGs.
  const std::string image = (corpus.fixtures() / "flux1_tiny" / "image.png").string();
  corpus.add(failing("inputs/compare-fifo", {"compare", image, png_fifo.string()},
                     {"[png] cannot read " + png_fifo.string() + ": it " + fifo_kind, "expected a PNG file"}));
  corpus.add(failing("inputs/compare-folder", {"compare", folder.string(), image},
                     {"[png] cannot read " + folder.string() + ": it is a folder"}));

  // A GGUF transformer named without .gguf: read as GGUF (it was parsed as safetensors and
  // failed on its "header length"), so the run succeeds. It writes out/out.png, so only the
  // models are watched.
  const fs::path gguf = dir / "transformer.weights";
  write_as_gguf(corpus.tiny_model() / "transformer" / "diffusion_pytorch_model.safetensors", gguf);
  Case named;
  named.name = "inputs/gguf-without-extension";
  named.args = gen({"--transformer", gguf.string(), "--out", (dir / "gguf.png").string()});
  named.exit_code = 0;
  named.expect = {"wrote " + (dir / "gguf.png").string()};
  named.forbid = {"[safetensors]"};
  named.watch = {corpus.models_dir()};
  corpus.add(std::move(named));
}

}  // namespace kiln::corpus
