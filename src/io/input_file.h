// Input files: the one check every reader of a file the user names goes through (checkpoints,
// configs, tokenizer files, shard indexes, --latents, the PNGs of kiln compare).
//
// Why: open(O_RDONLY) on a FIFO blocks until some other process opens it for writing, so a FIFO
// where a checkpoint or a PNG was expected used to hang kiln forever; a socket, a device or a
// folder gave an odd error deep in a parser. Here such a path is refused with one line saying
// what it is and what was expected, and nothing is ever opened in a way that can block: the
// path is stat()ed first, then opened with O_NONBLOCK and fstat()ed again (the node may have
// been swapped in between), and O_NONBLOCK is cleared only once the descriptor is known to be a
// regular file. Symlinks are followed (a hub cache's snapshots are links into blobs/).
#pragma once
#include <sys/types.h>

#include <filesystem>
#include <string>

namespace kiln::io {

// What a file mode names, as messages say it: "a regular file", "a folder", "a FIFO",
// "a socket", "a character device", "a block device", "a symlink".
std::string node_kind(mode_t mode);

// Why `path` cannot be read as an input file, as the end of a sentence whose subject is the
// path: "" for a regular file (symlinks followed); "does not exist (No such file or directory)";
// "is a FIFO, not a regular file" (or a folder, socket, device); "cannot be read (Permission
// denied)". Only stat()s.
std::string input_file_problem(const std::filesystem::path& path);

// Throws kiln::Error "[where] <what> <problem>; expected <expected>" when input_file_problem
// finds one, e.g. "[cli] --latents /tmp/p is a FIFO, not a regular file; expected a
// safetensors file".
void check_input_file(const std::string& where, const std::string& what, const std::filesystem::path& path,
                      const std::string& expected);

// Opens `path` read-only (O_CLOEXEC) without ever blocking, as above. Returns the descriptor, or
// -1 with *problem set as input_file_problem sets it.
int open_input_file(const std::filesystem::path& path, std::string* problem);

// The whole of the regular file `path`, read through open_input_file. Throws kiln::Error
// "[where] <path> <problem>; expected <expected>" when it is not one or cannot be read.
std::string read_input_file(const std::string& where, const std::filesystem::path& path,
                            const std::string& expected);

}  // namespace kiln::io
