// GPT-2's byte-level alphabet, shared by its BPE (data/gpt2_tokenizer.h) and tokenizer.json's
// ByteLevel pre-tokenizer and decoder (data/hf_tokenizer.h): each byte stands for one printable
// character, the printable Latin-1 bytes for themselves and the others for U+0100 on, in byte order.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>

namespace anvil {

// cp as UTF-8, appended to out.
void append_utf8(std::string& out, uint32_t cp);

struct ByteChars {
  std::string of_byte[256];                     // a byte's character, as UTF-8
  std::unordered_map<uint32_t, uint8_t> byte_of;  // a character's byte
};
const ByteChars& byte_chars();

}  // namespace anvil
