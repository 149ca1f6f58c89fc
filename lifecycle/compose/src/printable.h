// Strips terminal control sequences from bytes relayed from the guest, so
// what a box wrote into a log or an error cannot move the cursor, retitle the
// terminal, rewrite the clipboard (OSC 52) or hide a line.
//
// Kept: printable bytes, '\n' and '\t', and UTF-8 (invalid bytes pass as they
// are). Dropped: every other C0 byte ('\r' too: it overwrites a line), DEL,
// ESC sequences whole (CSI up to its final byte; OSC, DCS, SOS, PM, APC up to
// BEL or ST; two- and three-byte escapes), and C1 controls as raw bytes 0x80-0x9f
// only where they cannot be UTF-8 continuation bytes, or as their UTF-8 form
// U+0080-U+009F (0x9b and 0x9d start a CSI or a string like ESC [ and ESC ]).
// Streaming: a sequence split across feed() calls is still dropped whole; the
// state is bounded (no buffering).
#pragma once

#include <string>
#include <string_view>

namespace fy::compose {

class Printable {
 public:
  // Appends the printable part of `in` to `out`.
  void feed(std::string_view in, std::string& out);

 private:
  enum class State { normal, esc, esc_inter, csi, str, str_esc, c2 };
  void control(unsigned char c, std::string& out);
  State st_ = State::normal;
  int utf8_left_ = 0;  // continuation bytes still expected in a valid sequence
};

// One-shot form.
std::string printable(std::string_view in);

}  // namespace fy::compose
