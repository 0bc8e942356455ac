// What kiln prints reaches a terminal escaped (core/terminal.h): control characters from files,
// flags and the environment as \xNN, kiln's own line breaks kept, other UTF-8 as it is.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/terminal.h"

namespace kiln {
namespace {

TEST(TerminalText, ControlCharactersAreEscapedAndPrintableUtf8Kept) {
  EXPECT_EQ(escape_controls("plain text, 'quoted' [1,2] \\x1b"), "plain text, 'quoted' [1,2] \\x1b");
  EXPECT_EQ(escape_controls("\x1b[31mred\x1b[0m"), "\\x1b[31mred\\x1b[0m");  // ESC: CSI colour
  EXPECT_EQ(escape_controls("a\nb\rc\td\x07\x7f"), "a\\x0ab\\x0dc\\x09d\\x07\\x7f");
  EXPECT_EQ(escape_controls("a\nb", /*keep_newlines=*/true), "a\nb");
  EXPECT_EQ(escape_controls(std::string("nul\0end", 7)), "nul\\x00end");
  // C1 controls: as UTF-8 (U+009B, CSI) and as a lone byte (an 8-bit terminal's CSI).
  EXPECT_EQ(escape_controls("\xc2\x9b" "2J \x9b" "2J"), "\\xc2\\x9b2J \\x9b2J");
  // Printable UTF-8 of every length is kept; malformed, overlong and surrogate bytes are not.
  EXPECT_EQ(escape_controls("caf\xc3\xa9 \xe7\x8c\xab \xf0\x9f\x90\x88 \xc2\xa0"),
            "caf\xc3\xa9 \xe7\x8c\xab \xf0\x9f\x90\x88 \xc2\xa0");
  EXPECT_EQ(escape_controls("\xc3"), "\\xc3");                 // cut short
  EXPECT_EQ(escape_controls("\xc0\xaf"), "\\xc0\\xaf");        // overlong '/'
  EXPECT_EQ(escape_controls("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate
  EXPECT_EQ(escape_controls("\xff\xfe"), "\\xff\\xfe");
  // Escaping twice changes nothing (an error quoting another error's message).
  const std::string once = escape_controls("\x1b]0;title\x07\xc2\x85");
  EXPECT_EQ(escape_controls(once), once);
}

// format_error escapes the values it quotes, where they enter the message: a message's only
// line breaks are those of kiln's own text (string literals, Lines).
TEST(TerminalText, ErrorMessagesEscapeTheirValuesAndKeepKilnsLineBreaks) {
  const std::string name = "\x1b[31mw\nkiln: wrote forged.png";
  try {
    KILN_CHECK(false, "weights", "tensor '", name, "' at ", std::string_view("a\tb"), " ", 3, "\n",
               Lines{"listing\nline 2\x1b"});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[weights] tensor '\\x1b[31mw\\x0akiln: wrote forged.png' at a\\x09b 3\nlisting\nline 2\\x1b");
  }
}

// print_line and print_lines: what reaches the stream has no control byte but kiln's newlines.
TEST(TerminalText, PrintedLinesHoldNoControlBytes) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("kiln_terminal_" + std::to_string(::getpid()));
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  print_line(f, "kiln: warning: %s (%d)", "x\x1b[2Jy\nz", 7);
  print_lines(f, "kiln: ", "[a] first\nsecond \x07\n");
  std::fclose(f);
  std::ifstream in(file);
  std::stringstream got;
  got << in.rdbuf();
  std::filesystem::remove(file);
  EXPECT_EQ(got.str(), "kiln: warning: x\\x1b[2Jy\\x0az (7)\nkiln: [a] first\nsecond \\x07\n");
}

}  // namespace
}  // namespace kiln
