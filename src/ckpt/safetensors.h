// The safetensors format (Hugging Face's): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the raw data. anvil stores weights and
// optimizer state in it so other tools can read them.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/fs.h"

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

// Where one tensor lies in a file: its dtype, shape and byte range [begin, end) from the file's start.
struct SafeTensorEntry {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// A file's header, read without its data and validated: header bounds, dtypes, shapes against
// byte ranges, every range inside the file.
struct SafeTensorsHeader {
  std::string path;
  std::map<std::string, std::string> metadata;
  std::map<std::string, SafeTensorEntry> tensors;
};
SafeTensorsHeader read_safetensors_header(const std::string& path);
// One tensor's bytes, read from the file the header came from.
SafeTensor read_safetensor(const SafeTensorsHeader& header, const std::string& name);
// The same into `dest`, which must hold exactly the tensor's bytes.
void read_safetensor_into(const SafeTensorsHeader& header, const std::string& name, void* dest, size_t bytes);

// Reads and validates a whole file.
SafeTensorsFile read_safetensors(const std::string& path);

// Writes a file tensor by tensor, so that no more than one tensor need be held: the header comes
// from the tensors declared up front (name, dtype, shape; laid out in that order), then write()
// takes each one's bytes in that order. Atomic: the file appears at commit().
class SafeTensorsWriter {
 public:
  struct Declared {
    std::string name, dtype;
    std::vector<int64_t> shape;
  };
  SafeTensorsWriter(const std::string& path, std::vector<Declared> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  void write(const std::string& name, const void* data, size_t bytes);
  void commit();

 private:
  std::vector<Declared> tensors_;
  std::vector<uint64_t> bytes_;
  size_t next_ = 0;
  AtomicFile file_;
};


}  // namespace anvil
