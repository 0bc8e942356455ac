// PNG files (libpng): 8-bit RGB images with text metadata (prompt, seed, steps, ...).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace kiln::io {

using PngText = std::vector<std::pair<std::string, std::string>>;

// Writes `rgb` (height * width * 3 bytes, row-major HWC) as an 8-bit RGB PNG with one text
// chunk per (keyword, text) pair: tEXt when the text is ASCII, uncompressed iTXt (UTF-8)
// otherwise. Keywords must be 1-79 printable Latin-1 characters without leading, trailing or
// double spaces (the PNG rule). `path` must name a regular file or nothing yet (the rule of
// io/output_file.h: never a folder, device, FIFO or socket; symlinks are followed and written
// through). The image is written to a temporary file next to the final target, fsynced and
// renamed onto it, so the target never holds a partial file. Errors are kiln::Error
// "[png] cannot write <path>: <reason>" and leave the target untouched and no temporary behind.
void write_png(const std::filesystem::path& path, const uint8_t* rgb, int64_t height, int64_t width,
               const PngText& text_metadata = {});

// The same PNG as write_png writes, as bytes (a server's answer). Errors are kiln::Error
// "[png] cannot encode the image: <reason>".
std::string encode_png(const uint8_t* rgb, int64_t height, int64_t width, const PngText& text_metadata = {});

struct PngImage {
  int64_t height = 0, width = 0;
  std::vector<uint8_t> rgb;  // height * width * 3, HWC
  PngText text;              // tEXt, zTXt and iTXt chunks in file order
};

// The most pixels read_png decodes: 2^28 (16384x16384, 768 MiB as RGB), far above any image
// kiln makes. Deflate compresses up to 1032:1, so a PNG of 2.6 MB can declare a 30000x30000
// image of one colour, whose 2.7 GB would be allocated before its first row is read.
constexpr uint64_t kMaxPngPixels = uint64_t(1) << 28;

// Reads any PNG as 8-bit RGB (palette and gray expanded, 16-bit reduced, alpha dropped).
// The size its header declares is checked before the pixels are allocated: at most
// kMaxPngPixels, and at most `max_bytes` bytes of RGB when given (what the caller has memory for).
// Errors are kiln::Error "[png] cannot read <path>: <reason>".
PngImage read_png(const std::filesystem::path& path, size_t max_bytes = 0);

}  // namespace kiln::io
