// Output files (--out, --report): the rule for what a path may name, checked before any work,
// and the atomic write that never destroys what the path names (docs/outputs.md).
//
// The rule. An output path must name a regular file that exists or that can be created:
//   - not "", not a name ending in '/', not an existing folder;
//   - symlinks are followed, as cp and image tools do (relative links resolve against the
//     link's folder); whatever the chain ends at must be a regular file or nothing yet — a
//     character or block device (/dev/null), a FIFO or a socket is refused, never replaced;
//   - a chain that ends at a missing file (a dangling symlink) is accepted: the write creates
//     that final target, and the link stays a link;
//   - a link in a sticky world-writable folder (/tmp) is followed only when the caller (euid) or
//     the folder's owner owns it — the kernel's protected_symlinks rule, which kiln's own
//     resolution and rename would otherwise bypass;
//   - the final target's name, and the temporary's below, must fit the folder's NAME_MAX, and the
//     temporary's path PATH_MAX (pathconf), so a long name fails before the run, not after it;
//   - the folder of the final target must exist, be a folder and be writable (access W_OK; as
//     root only a read-only file system makes it fail).
// The write goes to a temporary `.NAME.tmp.PID.N` next to the final target, is fsynced and
// renamed onto it, so a symlink stays a symlink, its target gets the new content, and the
// target never holds a partial file. A new file gets mode 0666 & ~umask; a replaced regular
// file keeps its mode (and, where allowed, its owner). Temporaries of the same NAME that a
// killed run left behind (their PID no longer alive) are removed by the next write there.
#pragma once
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

namespace kiln::io {

// Why `path` cannot be an output file under the rule above ("" when it can), e.g. "it is a
// FIFO, not a regular file; kiln writes only regular files". On "" *target (when given) gets
// the final target: the path with every symlink of its last component followed.
std::string output_problem(const std::filesystem::path& path, std::filesystem::path* target = nullptr);

// The rule, checked before any work: returns the final target, or throws kiln::Error
// "[output] cannot write <path> (<what>): <reason>" (`what` names the flag, e.g. "--out"; when
// empty, no parentheses).
std::filesystem::path resolve_output(const std::string& what, const std::filesystem::path& path);

// Whether two output paths end at the same file (after symlinks; also hard links of one file).
bool same_output_file(const std::filesystem::path& a, const std::filesystem::path& b);

// Resolves `path` (the rule), removes stale temporaries of its name, then calls `write` on a
// temporary file next to the final target, fsyncs it and renames it onto the target. Errors,
// including any exception `write` throws (passed on as it is), remove the temporary and leave
// the target untouched; the rule's and the I/O's errors are kiln::Error
// "[where] cannot write <path>: <reason>".
void write_output_atomically(const std::string& where, const std::filesystem::path& path,
                             const std::function<void(std::FILE*)>& write);

// Whether the process that named a temporary with its PID `pid` is gone (kill(PID, 0) fails with
// ESRCH), so its temporary is stale; false for this process and for live ones (also those not
// ours to signal), whose writes may be in progress.
bool temporary_owner_is_gone(long pid);

// Removes the temporaries `.NAME.tmp.PID.N` in `folder` whose PID is no longer alive (kill(PID, 0)
// fails with ESRCH); those of live processes are kept. Returns how many were removed.
int remove_stale_temporaries(const std::filesystem::path& folder, const std::string& name);

}  // namespace kiln::io
