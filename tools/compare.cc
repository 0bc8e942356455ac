// `kiln compare A.png B.png`: how far two images are apart, channel value by channel value — to
// check a kiln image against Diffusers' (the fixtures' image.png) or two modes against each other.
#include <cstdio>
#include <cstdlib>

#include "commands.h"
#include "help.h"
#include "core/env.h"
#include "core/error.h"
#include "core/terminal.h"
#include "devices/runtime.h"
#include "io/png.h"

namespace kiln::cli {

int compare(const std::vector<std::string>& args) {
  std::vector<std::string> files;
  int64_t tolerance = 1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--tolerance") {
      KILN_CHECK(i + 1 < args.size(), "cli", "flag --tolerance needs a value");
      tolerance = parse_int("--tolerance", args[++i]);
      KILN_CHECK(tolerance >= 0 && tolerance <= 255, "cli", "--tolerance must be in [0, 255], got ", tolerance);
    } else if (args[i].starts_with("--")) {
      unknown_flag("compare", args[i]);
    } else {
      files.push_back(args[i]);
    }
  }
  KILN_CHECK(files.size() == 2, "cli", "compare needs two PNG files, got ", files.size());
  // Both images are held at once: each may take half the memory the machine has left, checked
  // against the size its PNG declares before its pixels are allocated (KILN_HOST_MEMORY_CHECK=0:
  // only the fixed limit, io::kMaxPngPixels).
  const size_t available = env::choice("KILN_HOST_MEMORY_CHECK").value_or("1") == "1"
                               ? runtime(Device::cpu()).physical_available_bytes()
                               : 0;
  const io::PngImage a = io::read_png(files[0], available / 2), b = io::read_png(files[1], available / 2);
  KILN_CHECK(a.height == b.height && a.width == b.width, "compare", files[0], " is ", a.height, "x", a.width, " but ",
             files[1], " is ", b.height, "x", b.width);
  int worst = 0;
  size_t differ = 0;
  for (size_t i = 0; i < a.rgb.size(); ++i) {
    const int d = std::abs(int(a.rgb[i]) - int(b.rgb[i]));
    worst = std::max(worst, d);
    differ += d != 0;
  }
  print_line(stdout,
             "%s vs %s (%lldx%lld): largest difference %d of 255, %zu of %zu channel values differ; %s (tolerance %lld)",
             files[0].c_str(), files[1].c_str(), static_cast<long long>(a.height), static_cast<long long>(a.width),
             worst, differ, a.rgb.size(), worst <= tolerance ? "same" : "DIFFERENT",
             static_cast<long long>(tolerance));
  return worst <= tolerance ? 0 : 1;
}

}  // namespace kiln::cli
