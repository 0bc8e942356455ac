// The KILN_* environment variables, read in one place and checked strictly: a value kiln cannot
// use is an error naming the variable and what it expects, never silently a default. Each
// variable is declared once (its kind and meaning) in env.cc; the readers below look it up.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::env {

// "1" on, "0" or unset/empty off; anything else is an error.
bool flag(const char* name);
// A positive whole number, or nullopt when unset/empty.
std::optional<uint64_t> positive_int(const char* name);
// A positive number, or nullopt when unset/empty.
std::optional<double> positive_number(const char* name);
// One of the variable's declared choices, or nullopt when unset/empty.
std::optional<std::string> choice(const char* name);
// The raw text (paths), or nullopt when unset/empty.
std::optional<std::string> text(const char* name);

// Checks every KILN_* variable in the environment now: each known one must hold a value of its
// kind (errors as above); the names of unknown ones are returned (a typo, most likely), so the
// caller can warn about them.
std::vector<std::string> check_all();

// "KILN_CACHE_DIR=DIR  meaning" lines for help texts.
std::string help();

}  // namespace kiln::env
