#include "data/python_text.h"

#include <unicode/locid.h>
#include <unicode/unistr.h>

#include "data/byte_level.h"

namespace anvil {

std::u32string code_points(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (i + n > s.size()) n = 1;
    char32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < n; k++) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

std::string utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool python_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {
std::string stripped(std::string_view s, bool left) {
  const std::u32string cp = code_points(s);
  size_t b = 0, e = cp.size();
  if (left)
    while (b < e && python_isspace(cp[b])) b++;
  while (e > b && python_isspace(cp[e - 1])) e--;
  return utf8(cp.substr(b, e - b));
}
}  // namespace

std::string python_strip(std::string_view s) { return stripped(s, true); }
std::string python_rstrip(std::string_view s) { return stripped(s, false); }

std::string python_utf8_replace(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  for (size_t i = 0; i < bytes.size();) {
    const unsigned char b = byte(i);
    if (b < 0x80) {
      out += static_cast<char>(b);
      i++;
      continue;
    }
    // A lead byte's length and its second byte's range (Unicode's table of well-formed UTF-8).
    int n = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) n = 2;
    else if (b >= 0xE0 && b <= 0xEF) n = 3, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4) n = 4, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    size_t k = 1;  // the bytes of a well-formed prefix
    while (n > 0 && static_cast<int>(k) < n && i + k < bytes.size()) {
      const unsigned char c = byte(i + k);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) break;
      k++;
    }
    if (n > 0 && static_cast<int>(k) == n) {
      out.append(bytes.substr(i, k));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal subpart
    }
    i += n > 0 ? k : 1;
  }
  return out;
}

namespace {
std::string case_mapped(std::string_view s, bool upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (upper)
    u.toUpper(icu::Locale::getRoot());
  else
    u.toLower(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}
}  // namespace

std::string python_lower(std::string_view s) { return case_mapped(s, false); }
std::string python_upper(std::string_view s) { return case_mapped(s, true); }

}  // namespace anvil
