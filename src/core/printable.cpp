// Error text made printable (core/printable.h).
#include "core/printable.h"

#include <cstdint>

namespace ls {

namespace {

// Length of the valid UTF-8 sequence at s[i] (2..4) and its code point; 0 if invalid
// (overlong forms, surrogates and values past U+10FFFF are invalid).
int utf8_sequence(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  int n = 0;
  uint32_t min = 0;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1Fu, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0Fu, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07u, min = 0x10000;
  else return 0;
  if (i + static_cast<size_t>(n) > s.size()) return 0;
  for (int k = 1; k < n; ++k) {
    const unsigned char x = b(i + static_cast<size_t>(k));
    if ((x & 0xC0u) != 0x80u) return 0;
    cp = (cp << 6) | (x & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

bool hidden_code_point(uint32_t cp) {
  return cp < 0xA0 ||                       // C1 controls (and anything below, never reached here)
         (cp >= 0x202A && cp <= 0x202E) ||  // bidirectional embeddings / overrides
         (cp >= 0x2066 && cp <= 0x2069) ||  // bidirectional isolates
         cp == 0x2028 || cp == 0x2029;      // line / paragraph separators
}

void escape_byte(std::string& out, unsigned char c) {
  static const char* hex = "0123456789abcdef";
  out += "\\x";
  out += hex[c >> 4];
  out += hex[c & 15];
}

}  // namespace

std::string printable_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if ((c >= 0x20 && c < 0x7F) || c == '\n' || c == '\t') {
      out += static_cast<char>(c);
      ++i;
    } else if (c < 0x80) {
      escape_byte(out, c);  // C0 controls (ESC among them), DEL
      ++i;
    } else {
      uint32_t cp = 0;
      const int n = utf8_sequence(text, i, cp);
      if (n == 0 || hidden_code_point(cp)) {
        // An invalid byte alone, or every byte of a hidden code point.
        const int k = n == 0 ? 1 : n;
        for (int j = 0; j < k; ++j) escape_byte(out, static_cast<unsigned char>(text[i + static_cast<size_t>(j)]));
        i += static_cast<size_t>(k);
      } else {
        out.append(text.substr(i, static_cast<size_t>(n)));
        i += static_cast<size_t>(n);
      }
    }
  }
  return out;
}

}  // namespace ls
