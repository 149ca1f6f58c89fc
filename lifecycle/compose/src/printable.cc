#include "printable.h"

namespace fy::compose {

void Printable::control(unsigned char c, std::string& out) {
  // c is a C1 control (0x80-0x9f), from its UTF-8 form.
  if (c == 0x9b) st_ = State::csi;
  else if (c == 0x9d || c == 0x90 || c == 0x98 || c == 0x9e || c == 0x9f) st_ = State::str;
  else st_ = State::normal;
}

void Printable::feed(std::string_view in, std::string& out) {
  for (unsigned char c : in) {
    switch (st_) {
      case State::normal:
        if (utf8_left_ > 0) {
          if ((c & 0xC0) == 0x80) {
            --utf8_left_;
            out += static_cast<char>(c);
            continue;
          }
          utf8_left_ = 0;  // broken sequence: judge c afresh
        }
        if (c == 0x1b) {
          st_ = State::esc;
        } else if (c == '\n' || c == '\t') {
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          // dropped
        } else if (c == 0xC2) {
          st_ = State::c2;  // U+0080..U+00BF: decide on the next byte
        } else if (c >= 0x80 && c <= 0x9f) {
          control(c, out);  // a bare C1 byte (not after a lead byte)
        } else {
          if (c >= 0xC3 && c <= 0xDF) utf8_left_ = 1;
          else if (c >= 0xE0 && c <= 0xEF) utf8_left_ = 2;
          else if (c >= 0xF0 && c <= 0xF4) utf8_left_ = 3;
          out += static_cast<char>(c);
        }
        break;
      case State::c2:
        if (c >= 0x80 && c <= 0x9f) {
          control(c, out);
        } else if (c >= 0xA0 && c <= 0xBF) {
          out += '\xC2';
          out += static_cast<char>(c);
          st_ = State::normal;
        } else {
          st_ = State::normal;  // a lone lead byte: drop it, judge c afresh
          feed(std::string_view(reinterpret_cast<const char*>(&c), 1), out);
        }
        break;
      case State::esc:
        if (c == '[') st_ = State::csi;
        else if (c == ']' || c == 'P' || c == 'X' || c == '^' || c == '_') st_ = State::str;
        else if (c >= 0x20 && c <= 0x2f) st_ = State::esc_inter;
        else if (c == 0x1b) st_ = State::esc;
        else st_ = State::normal;  // the final byte of a two-byte escape
        break;
      case State::esc_inter:
        if (c >= 0x30 && c <= 0x7e) st_ = State::normal;
        else if (c == 0x1b) st_ = State::esc;
        break;
      case State::csi:
        if (c >= 0x40 && c <= 0x7e) st_ = State::normal;
        else if (c == 0x1b) st_ = State::esc;
        break;
      case State::str:
        if (c == 0x07) st_ = State::normal;
        else if (c == 0x1b) st_ = State::str_esc;
        break;
      case State::str_esc:
        st_ = c == '\\' ? State::normal : (c == 0x1b ? State::str_esc : State::str);
        break;
    }
  }
}

std::string printable(std::string_view in) {
  Printable p;
  std::string out;
  p.feed(in, out);
  return out;
}

}  // namespace fy::compose
