// safetensors read and write. Reads validate every byte range against the file before use.
#include "ckpt/safetensors.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace anvil {
namespace fs = std::filesystem;
namespace {
size_t dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}
}  // namespace

size_t SafeTensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

const float* SafeTensor::f32() const {
  ANVIL_CHECK(dtype == "F32", "expected an F32 tensor, found {}", dtype);
  return reinterpret_cast<const float*>(data.data());
}

const int32_t* SafeTensor::i32() const {
  ANVIL_CHECK(dtype == "I32", "expected an I32 tensor, found {}", dtype);
  return reinterpret_cast<const int32_t*>(data.data());
}

const SafeTensor& SafeTensorsFile::at(const std::string& name) const {
  auto it = tensors.find(name);
  ANVIL_CHECK(it != tensors.end(), "tensor '{}' is missing", name);
  return it->second;
}

SafeTensorsHeader read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ANVIL_CHECK(in.good(), "cannot open safetensors file '{}'", path);
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  ANVIL_CHECK(!ec && size >= 8, "'{}' is not a safetensors file: only {} bytes", path, ec ? 0 : size);
  uint64_t header_len = 0;
  in.read(reinterpret_cast<char*>(&header_len), 8);
  ANVIL_CHECK(in.good() && header_len <= size - 8, "'{}' is truncated or not safetensors: header of {} bytes "
              "in a {}-byte file", path, header_len, size);
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  ANVIL_CHECK(in.good(), "cannot read the header of '{}'", path);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    ANVIL_FAIL("'{}' has a malformed safetensors header: {}", path, e.what());
  }
  ANVIL_CHECK(header.is_object(), "'{}' has a malformed safetensors header", path);
  const uint64_t data_start = 8 + header_len, data_len = size - data_start;
  SafeTensorsHeader out;
  out.path = path;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      ANVIL_CHECK(entry.is_object(), "'{}': __metadata__ must map names to strings", path);
      for (auto& [k, v] : entry.items()) {
        ANVIL_CHECK(v.is_string(), "'{}': __metadata__ value of '{}' is not a string", path, k);
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    try {
      SafeTensorEntry t;
      t.dtype = entry.at("dtype").get<std::string>();
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      auto off = entry.at("data_offsets").get<std::vector<uint64_t>>();
      ANVIL_CHECK(dtype_size(t.dtype) > 0, "'{}': tensor '{}' has unknown dtype {}", path, name, t.dtype);
      ANVIL_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= data_len,
                  "'{}' is truncated: tensor '{}' ends past the end of the file", path, name);
      uint64_t numel = 1;
      for (int64_t d : t.shape) {
        ANVIL_CHECK(d >= 0, "'{}': tensor '{}' has a negative dimension", path, name);
        numel *= static_cast<uint64_t>(d);
      }
      ANVIL_CHECK(off[1] - off[0] == numel * dtype_size(t.dtype), "'{}': tensor '{}' has {} bytes for shape of {} "
                  "elements", path, name, off[1] - off[0], numel);
      t.begin = data_start + off[0];
      t.end = data_start + off[1];
      out.tensors.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      ANVIL_FAIL("'{}': malformed entry for tensor '{}': {}", path, name, e.what());
    }
  }
  return out;
}

void read_safetensor_into(const SafeTensorsHeader& header, const std::string& name, void* dest, size_t bytes) {
  const auto it = header.tensors.find(name);
  ANVIL_CHECK(it != header.tensors.end(), "'{}' has no tensor '{}'", header.path, name);
  const SafeTensorEntry& e = it->second;
  ANVIL_CHECK(bytes == e.end - e.begin, "tensor '{}' of '{}' holds {} bytes, not {}", name, header.path, e.end - e.begin,
              bytes);
  std::ifstream in(header.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(e.begin));
  in.read(static_cast<char*>(dest), static_cast<std::streamsize>(bytes));
  ANVIL_CHECK(in.good(), "cannot read tensor '{}' of '{}' (was the file truncated since?)", name, header.path);
}

SafeTensor read_safetensor(const SafeTensorsHeader& header, const std::string& name) {
  const auto it = header.tensors.find(name);
  ANVIL_CHECK(it != header.tensors.end(), "'{}' has no tensor '{}'", header.path, name);
  SafeTensor t;
  t.dtype = it->second.dtype;
  t.shape = it->second.shape;
  t.data.resize(it->second.end - it->second.begin);
  read_safetensor_into(header, name, t.data.data(), t.data.size());
  return t;
}

SafeTensorsFile read_safetensors(const std::string& path) {
  SafeTensorsHeader header = read_safetensors_header(path);
  SafeTensorsFile out;
  out.metadata = std::move(header.metadata);
  for (const auto& [name, entry] : header.tensors) out.tensors.emplace(name, read_safetensor(header, name));
  return out;
}

SafeTensorsWriter::SafeTensorsWriter(const std::string& path, std::vector<Declared> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : tensors_(std::move(tensors)), file_(path) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Declared& t : tensors_) {
    ANVIL_CHECK(dtype_size(t.dtype) > 0, "safetensors dtype '{}' of '{}' is not known", t.dtype, t.name);
    uint64_t bytes = dtype_size(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<uint64_t>(d);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    bytes_.push_back(bytes);
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const uint64_t len = h.size();
  file_.expect_bytes(8 + len + offset);
  file_.write(&len, 8);
  file_.write(h.data(), h.size());
}

void SafeTensorsWriter::write(const std::string& name, const void* data, size_t bytes) {
  ANVIL_CHECK(next_ < tensors_.size() && tensors_[next_].name == name && bytes_[next_] == bytes,
              "safetensors writer: '{}' ({} bytes) is not the next tensor declared", name, bytes);
  file_.write(data, bytes);
  next_++;
}

void SafeTensorsWriter::commit() {
  ANVIL_CHECK(next_ == tensors_.size(), "safetensors writer: {} of {} tensors written", next_, tensors_.size());
  file_.commit();
}

}  // namespace anvil
