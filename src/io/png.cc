#include "io/png.h"

#include <png.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "io/input_file.h"
#include "io/output_file.h"

namespace kiln::io {

namespace {

// libpng reports errors by longjmp; the message is kept here for the kiln::Error.
struct ErrorSink {
  char message[256] = "unknown libpng error";
};

void on_error(png_structp png, png_const_charp msg) {
  auto* sink = static_cast<ErrorSink*>(png_get_error_ptr(png));
  std::snprintf(sink->message, sizeof sink->message, "%s", msg);
  png_longjmp(png, 1);
}
void on_warning(png_structp, png_const_charp) {}

// The libpng calls live in these two functions, which hold no object with a destructor, so
// the longjmp out of an error skips nothing (the buffers belong to the callers).
bool encode(FILE* f, const uint8_t* rgb, png_uint_32 height, png_uint_32 width, png_text* texts, int n_text,
            ErrorSink* sink) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, sink, on_error, on_warning);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_write_struct(&png, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (n_text > 0) png_set_text(png, info, texts, n_text);
  png_write_info(png, info);
  for (png_uint_32 y = 0; y < height; ++y) png_write_row(png, rgb + size_t(y) * width * 3);
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

// Decodes into out->rgb and copies the text chunks (before and after the image data). The
// declared size is checked against kMaxPngPixels and `max_bytes` (0: none) before anything is
// allocated for the pixels.
bool decode(FILE* f, PngImage* out, size_t max_bytes, ErrorSink* sink) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, sink, on_error, on_warning);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  png_infop end = info ? png_create_info_struct(png) : nullptr;
  if (!end) {
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, &end);
    return false;
  }
  png_init_io(png, f);
  png_read_info(png, info);
  const uint64_t declared_h = png_get_image_height(png, info), declared_w = png_get_image_width(png, info);
  const uint64_t declared_bytes = declared_h * declared_w * 3;
  if (declared_h * declared_w > kMaxPngPixels || (max_bytes && declared_bytes > max_bytes)) {
    char limit[96];
    if (declared_h * declared_w > kMaxPngPixels)
      std::snprintf(limit, sizeof limit, "%llu pixels (16384x16384)", static_cast<unsigned long long>(kMaxPngPixels));
    else
      std::snprintf(limit, sizeof limit, "%.2f GiB, the memory available for it", double(max_bytes) / double(1 << 30));
    std::snprintf(sink->message, sizeof sink->message,
                  "it declares %llux%llu pixels (HxW), %.2f GiB as 8-bit RGB; expected at most %s",
                  static_cast<unsigned long long>(declared_h), static_cast<unsigned long long>(declared_w),
                  double(declared_bytes) / double(1 << 30), limit);
    png_destroy_read_struct(&png, &info, &end);
    return false;
  }
  png_set_expand(png);  // palette -> RGB, gray < 8 bits -> 8, tRNS -> alpha
  png_set_strip_16(png);
  png_set_strip_alpha(png);
  png_set_gray_to_rgb(png);
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const png_uint_32 height = png_get_image_height(png, info), width = png_get_image_width(png, info);
  if (png_get_channels(png, info) != 3 || png_get_rowbytes(png, info) != size_t(width) * 3) {
    std::snprintf(sink->message, sizeof sink->message, "unexpected layout after conversion to 8-bit RGB");
    png_destroy_read_struct(&png, &info, &end);
    return false;
  }
  out->height = height;
  out->width = width;
  out->rgb.assign(size_t(height) * width * 3, 0);
  // Interlaced images are read pass by pass into the same full-size rows.
  for (int p = 0; p < passes; ++p)
    for (png_uint_32 y = 0; y < height; ++y) png_read_row(png, out->rgb.data() + size_t(y) * width * 3, nullptr);
  png_read_end(png, end);
  for (png_infop i : {info, end}) {
    png_textp texts = nullptr;
    const int n = png_get_text(png, i, &texts, nullptr);
    for (int t = 0; t < n; ++t) {
      const size_t len = texts[t].compression > 0 ? texts[t].itxt_length : texts[t].text_length;
      out->text.emplace_back(texts[t].key, std::string(texts[t].text ? texts[t].text : "", len));
    }
  }
  png_destroy_read_struct(&png, &info, &end);
  return true;
}

// PNG keywords: 1-79 Latin-1 printable characters, no leading/trailing/consecutive spaces.
bool valid_keyword(const std::string& k) {
  if (k.empty() || k.size() > 79 || k.front() == ' ' || k.back() == ' ') return false;
  for (size_t i = 0; i < k.size(); ++i) {
    const auto c = static_cast<unsigned char>(k[i]);
    if (c < 32 || (c > 126 && c < 161)) return false;
    if (c == ' ' && i > 0 && k[i - 1] == ' ') return false;
  }
  return true;
}

bool is_ascii(const std::string& s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace

namespace {

// The text chunks of `text_metadata`, pointing into it; `fail_write` is called with the reason
// of a keyword or text PNG cannot hold.
template <typename Fail>
std::vector<png_text> text_chunks(const PngText& text_metadata, Fail fail_write) {
  std::vector<png_text> texts(text_metadata.size());
  for (size_t i = 0; i < text_metadata.size(); ++i) {
    const auto& [key, value] = text_metadata[i];
    if (!valid_keyword(key)) fail_write("invalid text keyword '" + key + "' (1-79 printable Latin-1 characters)");
    if (value.find('\0') != std::string::npos) fail_write("text '" + key + "' contains a NUL byte");
    png_text& t = texts[i];
    std::memset(&t, 0, sizeof t);
    // libpng copies keys and texts; it only takes them as non-const pointers.
    t.key = const_cast<char*>(key.c_str());
    t.text = const_cast<char*>(value.c_str());
    // tEXt is Latin-1; anything beyond ASCII is taken as UTF-8 and goes into iTXt.
    if (is_ascii(value)) {
      t.compression = PNG_TEXT_COMPRESSION_NONE;
      t.text_length = value.size();
    } else {
      t.compression = PNG_ITXT_COMPRESSION_NONE;
      t.itxt_length = value.size();
      t.lang = const_cast<char*>("");
      t.lang_key = const_cast<char*>("");
    }
  }
  return texts;
}

template <typename Fail>
void check_image(const uint8_t* rgb, int64_t height, int64_t width, Fail fail_write) {
  if (height <= 0 || width <= 0 || height > 0x7fffffff || width > 0x7fffffff / 3)
    fail_write("image size " + std::to_string(height) + "x" + std::to_string(width) + " is not supported");
  if (!rgb) fail_write("no pixel data");
}

}  // namespace

void write_png(const std::filesystem::path& path, const uint8_t* rgb, int64_t height, int64_t width,
               const PngText& text_metadata) {
  auto fail_write = [&](const std::string& reason) { fail("png", "cannot write ", path.string(), ": ", reason); };
  check_image(rgb, height, width, fail_write);
  if (path.filename().empty()) fail_write("not a file name");
  std::vector<png_text> texts = text_chunks(text_metadata, fail_write);

  // Through a temporary next to the final target, fsynced and renamed onto it (io/output_file.h):
  // `path` never holds a partial file, and a symlink is written through, not replaced.
  write_output_atomically("png", path, [&](FILE* f) {
    ErrorSink sink;
    if (!encode(f, rgb, png_uint_32(height), png_uint_32(width), texts.data(), int(texts.size()), &sink))
      fail_write(sink.message);
  });
}

std::string encode_png(const uint8_t* rgb, int64_t height, int64_t width, const PngText& text_metadata) {
  auto fail_encode = [&](const std::string& reason) { fail("png", "cannot encode the image: ", reason); };
  check_image(rgb, height, width, fail_encode);
  std::vector<png_text> texts = text_chunks(text_metadata, fail_encode);
  char* data = nullptr;
  size_t size = 0;
  FILE* f = ::open_memstream(&data, &size);  // the same encoder as write_png, into memory
  if (!f) fail_encode(std::strerror(errno));
  ErrorSink sink;
  const bool ok = encode(f, rgb, png_uint_32(height), png_uint_32(width), texts.data(), int(texts.size()), &sink);
  const bool closed = std::fclose(f) == 0;
  std::string bytes = ok && closed ? std::string(data, size) : std::string();
  std::free(data);
  if (!ok) fail_encode(sink.message);
  if (!closed) fail_encode("out of memory");
  return bytes;
}

PngImage read_png(const std::filesystem::path& path, size_t max_bytes) {
  // Never a blocking open: a FIFO, socket, device or folder is refused (io/input_file.h).
  std::string problem;
  const int fd = open_input_file(path, &problem);
  if (fd < 0) fail("png", "cannot read ", path.string(), ": it ", problem, "; expected a PNG file");
  FILE* f = ::fdopen(fd, "rb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    fail("png", "cannot read ", path.string(), ": ", std::strerror(err));
  }
  unsigned char sig[8] = {};
  const bool is_png = std::fread(sig, 1, 8, f) == 8 && png_sig_cmp(sig, 0, 8) == 0;
  std::rewind(f);
  if (!is_png) {
    std::fclose(f);
    fail("png", "cannot read ", path.string(), ": not a PNG file (bad signature)");
  }
  PngImage image;
  ErrorSink sink;
  const bool ok = decode(f, &image, max_bytes, &sink);
  std::fclose(f);
  if (!ok) fail("png", "cannot read ", path.string(), ": ", sink.message);
  return image;
}

}  // namespace kiln::io
