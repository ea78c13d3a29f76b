// Text as Python sees it, for what anvil must compute as a Python tool does (Jinja chat
// templates, LLM Foundry's evaluation): strings as code points, str.isspace, str.strip.
// Inputs are valid UTF-8 (JSON and YAML readers check it); a byte that starts no sequence counts
// as one code point of its own value.
#pragma once
#include <string>
#include <string_view>

namespace anvil {

std::u32string code_points(std::string_view s);
std::string utf8(const std::u32string& s);
// Python's str.isspace() of one character.
bool python_isspace(char32_t c);
// Python's str.strip() and str.rstrip(): whitespace as str.isspace names it.
std::string python_strip(std::string_view s);
std::string python_rstrip(std::string_view s);
// Python's bytes.decode("utf-8", errors="replace"): each maximal ill-formed subsequence one
// U+FFFD, as transformers decodes byte-level tokens that end inside a character.
std::string python_utf8_replace(std::string_view bytes);
// Python's str.lower() and str.upper(): Unicode's full case mappings (ICU's root locale).
std::string python_lower(std::string_view s);
std::string python_upper(std::string_view s);

}  // namespace anvil
