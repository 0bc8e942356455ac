#include "models/random/flux1_random_folder.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <system_error>

#include "core/error.h"
#include "io/output_file.h"
#include "models/random/autoencoder_kl_random.h"
#include "models/random/clip_text_random.h"
#include "models/random/flux_transformer_random.h"
#include "models/random/t5_encoder_random.h"

namespace kiln::random_weights {

namespace fs = std::filesystem;

namespace {

constexpr const char* kWhere = "make-random";
constexpr const char* kTokenizers[] = {"tokenizer", "tokenizer_2"};

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

void write_text(const fs::path& path, const std::string& text) {
  io::write_output_atomically(kWhere, path, [&](std::FILE* f) { std::fwrite(text.data(), 1, text.size(), f); });
}

void check_options(const Flux1RandomOptions& o) {
  KILN_CHECK(o.num_layers >= 0 && o.num_single_layers >= 0, kWhere, "block counts must be >= 0, got ", o.num_layers,
             "+", o.num_single_layers);
  KILN_CHECK(o.t5_layers >= 1, kWhere, "T5 needs at least 1 layer (block 0 holds the position bias), got ",
             o.t5_layers);
  KILN_CHECK(is_floating(o.dtype), kWhere, "weights are f32, bf16 or f16, not ", dtype_name(o.dtype));
}

uint64_t tree_bytes(const fs::path& dir) {
  uint64_t bytes = 0;
  try {
    for (const auto& e : fs::recursive_directory_iterator(dir))
      if (e.is_regular_file()) bytes += e.file_size();
  } catch (const fs::filesystem_error& e) {
    fail(kWhere, "cannot read ", dir.string(), ": ", e.what());
  }
  return bytes;
}

// The folder's temporaries: ".NAME.make-random.PID".
std::string temp_prefix(const fs::path& target) {
  std::string s = ".";  // appended piece by piece: GCC 12 misreports "." + string (-Wrestrict)
  s += target.filename().string();
  s += ".make-random.";
  return s;
}

// Removes the temporaries of `target` that a killed run left (their PID no longer alive).
void remove_stale_folders(const fs::path& target) {
  const std::string prefix = temp_prefix(target);
  std::error_code ec;
  for (auto it = fs::directory_iterator(target.parent_path(), ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string pid = n.substr(prefix.size());
    if (pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (!io::temporary_owner_is_gone(std::stol(pid))) continue;
    std::error_code rm;
    if (it->symlink_status(rm).type() == fs::file_type::directory) fs::remove_all(it->path(), rm);
  }
}

// Creates the missing ancestors of `target` (as mkdir -p); returns them, top first.
std::vector<fs::path> create_parents(const fs::path& target, const fs::path& shown) {
  std::vector<fs::path> missing;
  std::error_code ec;
  for (fs::path p = target.parent_path(); !p.empty() && !fs::exists(p, ec); p = p.parent_path()) {
    missing.insert(missing.begin(), p);
    if (p == p.parent_path()) break;
  }
  for (const fs::path& p : missing) {
    fs::create_directory(p, ec);
    KILN_CHECK(!ec, kWhere, "cannot create ", p.string(), " (the parent of ", shown.string(), "): ", ec.message());
  }
  KILN_CHECK(fs::is_directory(target.parent_path(), ec), kWhere, "cannot write ", shown.string(), ": ",
             target.parent_path().string(), " is not a folder");
  return missing;
}

// Refuses a DIR that exists as anything but an empty folder.
void check_target(const fs::path& target, const fs::path& shown) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(target, ec);
  if (ec || st.type() == fs::file_type::not_found) return;
  KILN_CHECK(st.type() != fs::file_type::symlink, kWhere, shown.string(),
             " is a symlink; give a new folder name (or an empty folder) to write into");
  KILN_CHECK(st.type() == fs::file_type::directory, kWhere, shown.string(),
             " exists and is not a folder; give a new folder name (or an empty folder) to write into");
  KILN_CHECK(fs::is_empty(target, ec) && !ec, kWhere, shown.string(),
             " is not empty; give a new folder name (or an empty folder): make-random never writes over files");
}

void fsync_folder(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

std::vector<RandomComponent> flux1_random_components(const Flux1RandomOptions& o) {
  return {clip_text_random(o.dtype), t5_encoder_random(o.t5_layers, o.dtype),
          flux_transformer_random(o.variant, o.num_layers, o.num_single_layers), autoencoder_kl_random()};
}

nlohmann::json flux1_model_index() {
  // The Hub's model_index.json, except tokenizer_2: the copied tokenizer folder is a slow
  // T5Tokenizer's (spiece.model, no tokenizer.json), and says so in its tokenizer_config.json.
  return {
      {"_class_name", "FluxPipeline"},
      {"_diffusers_version", "0.30.0.dev0"},
      {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
      {"text_encoder", {"transformers", "CLIPTextModel"}},
      {"text_encoder_2", {"transformers", "T5EncoderModel"}},
      {"tokenizer", {"transformers", "CLIPTokenizer"}},
      {"tokenizer_2", {"transformers", "T5Tokenizer"}},
      {"transformer", {"diffusers", "FluxTransformer2DModel"}},
      {"vae", {"diffusers", "AutoencoderKL"}},
  };
}

nlohmann::json flux1_scheduler_config(Flux1Variant variant) {
  const bool dev = variant == Flux1Variant::dev;  // dev shifts the schedule by the image size
  return {
      {"_class_name", "FlowMatchEulerDiscreteScheduler"},
      {"_diffusers_version", "0.30.0.dev0"},
      {"base_image_seq_len", 256},
      {"base_shift", 0.5},
      {"max_image_seq_len", 4096},
      {"max_shift", 1.15},
      {"num_train_timesteps", 1000},
      {"shift", dev ? 3.0 : 1.0},
      {"use_dynamic_shifting", dev},
  };
}

uint64_t Flux1RandomFolder::total_bytes() const {
  uint64_t b = other_bytes;
  for (const WrittenComponent& c : components) b += c.bytes;
  return b;
}

int64_t Flux1RandomFolder::total_parameters() const {
  int64_t n = 0;
  for (const WrittenComponent& c : components) n += c.parameters;
  return n;
}

Flux1RandomFolder write_flux1_random_folder(const fs::path& dir, const Flux1RandomOptions& options,
                                            const fs::path& tokenizers_from, const Flux1RandomProgress& progress) {
  // ---- every check before any work ----
  check_options(options);
  KILN_CHECK(!dir.empty(), kWhere, "the output folder is \"\"; expected a folder name");
  for (const char* t : kTokenizers)
    KILN_CHECK(fs::is_directory(tokenizers_from / t), kWhere, "tokenizer folder ", (tokenizers_from / t).string(),
               " is missing (make-random copies the bundled checkpoint's tokenizers)");
  fs::path target = fs::absolute(dir).lexically_normal();
  if (target.filename().empty()) target = target.parent_path();  // "out/" names "out"
  KILN_CHECK(!target.filename().empty() && target.filename() != "." && target.filename() != "..", kWhere,
             "cannot write ", dir.string(), ": expected a folder name");
  check_target(target, dir);

  // The bytes to write, from the shapes alone (every file's header is well under 1 KiB a tensor),
  // so that even an absurd --blocks is refused at once.
  const std::vector<RandomComponent> components = flux1_random_components(options);
  uint64_t needed = 1 << 20;  // configs, model_index.json, the scheduler config, shard indexes
  for (const RandomComponent& c : components)
    needed += uint64_t(c.parameters()) * dtype_size(options.dtype) + 1024 * c.tensors.size();
  for (const char* t : kTokenizers) needed += tree_bytes(tokenizers_from / t);

  const std::vector<fs::path> created = create_parents(target, dir);
  const fs::path parent = target.parent_path();
  const fs::path temp = parent / (temp_prefix(target) + std::to_string(::getpid()));
  auto undo = [&] {
    std::error_code ec;
    fs::remove_all(temp, ec);
    for (auto it = created.rbegin(); it != created.rend(); ++it) fs::remove(*it, ec);  // only if still empty
  };
  try {
    std::error_code ec;
    const fs::space_info space = fs::space(parent, ec);
    KILN_CHECK(ec || space.available >= needed, kWhere, "cannot write ", dir.string(), ": it needs ", gib(needed),
               " but ", parent.string(), " has ", gib(space.available), " free");
    remove_stale_folders(target);
    fs::create_directory(temp, ec);
    KILN_CHECK(!ec, kWhere, "cannot create ", temp.string(), ": ", ec.message());

    // ---- the folder, in the temporary ----
    Flux1RandomFolder done;
    write_text(temp / "model_index.json", flux1_model_index().dump(2) + "\n");
    fs::create_directory(temp / "scheduler", ec);
    KILN_CHECK(!ec, kWhere, "cannot create ", (temp / "scheduler").string(), ": ", ec.message());
    write_text(temp / "scheduler" / "scheduler_config.json", flux1_scheduler_config(options.variant).dump(2) + "\n");
    for (const char* t : kTokenizers) {
      fs::copy(tokenizers_from / t, temp / t, fs::copy_options::recursive, ec);
      KILN_CHECK(!ec, kWhere, "cannot copy ", (tokenizers_from / t).string(), " to ", (temp / t).string(), ": ",
                 ec.message());
    }
    done.other_bytes = tree_bytes(temp);
    for (size_t i = 0; i < components.size(); ++i) {
      if (progress.starting) progress.starting(plan_random_component(components[i], options.dtype));
      const auto t0 = std::chrono::steady_clock::now();
      done.components.push_back(write_random_component(temp, components[i], options.dtype, options.seed));
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (progress.written) progress.written(done.components.back(), seconds);
    }
    for (const auto& e : fs::recursive_directory_iterator(temp))
      if (e.is_directory()) fsync_folder(e.path());
    fsync_folder(temp);

    // ---- into place: rename(2) replaces an empty folder, never a full one ----
    if (::rename(temp.c_str(), target.c_str()) != 0)
      fail(kWhere, "cannot rename ", temp.string(), " to ", dir.string(), ": ", std::strerror(errno));
    fsync_folder(parent);
    return done;
  } catch (const fs::filesystem_error& e) {
    undo();
    fail(kWhere, "cannot write ", dir.string(), ": ", e.what());
  } catch (...) {
    undo();
    throw;
  }
}

}  // namespace kiln::random_weights
