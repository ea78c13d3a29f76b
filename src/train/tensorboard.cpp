// The protobuf wire format is written by hand for the three messages involved (Event, Summary,
// Summary.Value): fields are tagged (number << 3 | wire type), strings and messages are
// length-delimited with a varint length, doubles and floats little-endian fixed width.
#include "train/tensorboard.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fs.h"

namespace anvil {
namespace {

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}

void fixed(std::string& out, const void* v, size_t bytes) { out.append(static_cast<const char*>(v), bytes); }

void tag(std::string& out, int field, int wire_type) { varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }

void length_delimited(std::string& out, int field, const std::string& bytes) {
  tag(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

// Event: wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5.
std::string event(int64_t step) {
  std::string e;
  const double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  tag(e, 1, 1);
  fixed(e, &wall, 8);
  tag(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xffffffffu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t crc = crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  make_dirs(dir);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  path_ = fmt::format("{}/events.out.tfevents.{}.{}.{}", dir,
                      std::chrono::duration_cast<std::chrono::seconds>(now).count(), host, ::getpid());
  f_ = std::fopen(path_.c_str(), "wb");
  ANVIL_CHECK(f_, "cannot create the TensorBoard event file '{}': {}", path_, std::strerror(errno));
  std::string first = event(0);
  length_delimited(first, 3, "brain.Event:2");
  record(first);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [name, v] : values) {
    std::string value;
    length_delimited(value, 1, name);  // Summary.Value.tag = 1
    const float f = static_cast<float>(v);
    tag(value, 2, 5);                  // Summary.Value.simple_value = 2 (float)
    fixed(value, &f, 4);
    length_delimited(summary, 1, value);  // Summary.value = 1
  }
  std::string e = event(step);
  length_delimited(e, 5, summary);
  record(e);
}

void TensorBoardWriter::record(const std::string& event) {
  const uint64_t len = event.size();
  const uint32_t len_crc = masked_crc32c(&len, 8), data_crc = masked_crc32c(event.data(), event.size());
  std::string r;
  fixed(r, &len, 8);
  fixed(r, &len_crc, 4);
  r += event;
  fixed(r, &data_crc, 4);
  ANVIL_CHECK(std::fwrite(r.data(), 1, r.size(), f_) == r.size() && std::fflush(f_) == 0,
              "cannot write the TensorBoard event file '{}': {}", path_, std::strerror(errno));
}

}  // namespace anvil
