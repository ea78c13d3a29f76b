// The safetensors format (Hugging Face's): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw data. anvil stores weights and
// optimizer state in it so other tools can read them.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace anvil {

struct SafeTensor {
  std::string dtype;  // "F32", "I32", ...
  std::vector<int64_t> shape;
  std::string data;   // raw little-endian bytes
  size_t numel() const;
  const float* f32() const;      // checks dtype
  const int32_t* i32() const;    // checks dtype
};

struct SafeTensorsFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, SafeTensor> tensors;
  const SafeTensor& at(const std::string& name) const;  // clear error when missing
};

// Reads and validates a whole file: header bounds, dtypes, shapes against byte ranges.
SafeTensorsFile read_safetensors(const std::string& path);

// Writes atomically. Tensors are laid out in name order.
void write_safetensors(const std::string& path, const SafeTensorsFile& file);

SafeTensor make_f32(const float* data, std::vector<int64_t> shape);

}  // namespace anvil
