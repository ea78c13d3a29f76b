// safetensors read and write. Reads validate every byte range against the file before use.
#include "ckpt/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace anvil {
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

SafeTensorsFile read_safetensors(const std::string& path) {
  const std::string bytes = read_file(path, "safetensors file");
  ANVIL_CHECK(bytes.size() >= 8, "'{}' is not a safetensors file: only {} bytes", path, bytes.size());
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  ANVIL_CHECK(header_len <= bytes.size() - 8, "'{}' is truncated or not safetensors: header of {} bytes "
              "in a {}-byte file", path, header_len, bytes.size());
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, header_len));
  } catch (const std::exception& e) {
    ANVIL_FAIL("'{}' has a malformed safetensors header: {}", path, e.what());
  }
  ANVIL_CHECK(header.is_object(), "'{}' has a malformed safetensors header", path);
  const size_t data_start = 8 + header_len, data_len = bytes.size() - data_start;
  SafeTensorsFile out;
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
      SafeTensor t;
      t.dtype = entry.at("dtype").get<std::string>();
      t.shape = entry.at("shape").get<std::vector<int64_t>>();
      auto off = entry.at("data_offsets").get<std::vector<uint64_t>>();
      ANVIL_CHECK(dtype_size(t.dtype) > 0, "'{}': tensor '{}' has unknown dtype {}", path, name, t.dtype);
      ANVIL_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= data_len,
                  "'{}' is truncated: tensor '{}' ends past the end of the file", path, name);
      ANVIL_CHECK(off[1] - off[0] == t.numel() * dtype_size(t.dtype),
                  "'{}': tensor '{}' has {} bytes for shape of {} elements", path, name,
                  off[1] - off[0], t.numel());
      t.data = bytes.substr(data_start + off[0], off[1] - off[0]);
      out.tensors.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      ANVIL_FAIL("'{}': malformed entry for tensor '{}': {}", path, name, e.what());
    }
  }
  return out;
}

void write_safetensors(const std::string& path, const SafeTensorsFile& file) {
  nlohmann::ordered_json header;
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (auto& [name, t] : file.tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  uint64_t len = h.size();
  AtomicFile f(path);
  f.write(&len, 8);
  f.write(h.data(), h.size());
  for (auto& [name, t] : file.tensors) f.write(t.data.data(), t.data.size());
  f.commit();
}

SafeTensor make_f32(const float* data, std::vector<int64_t> shape) {
  SafeTensor t;
  t.dtype = "F32";
  t.shape = std::move(shape);
  t.data.assign(reinterpret_cast<const char*>(data), t.numel() * sizeof(float));
  return t;
}

}  // namespace anvil
