// MDS v2 reading and writing. The byte layout follows MosaicML streaming's specification: see
// docs/formats.md for the shard layout, the index keys and the token column encoding.
#include "data/mds.h"

#include <openssl/evp.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace anvil {
namespace {

using json = nlohmann::json;

// Python's json.dumps(obj, sort_keys=True): ", " and ": " separators, ASCII-only strings.
void dump_python(const json& v, std::string& out) {
  switch (v.type()) {
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {  // nlohmann's object map is key-sorted
        if (!first) out += ", ";
        first = false;
        dump_python(json(it.key()), out);
        out += ": ";
        dump_python(it.value(), out);
      }
      out += '}';
      break;
    }
    case json::value_t::array: {
      out += '[';
      for (size_t i = 0; i < v.size(); i++) {
        if (i) out += ", ";
        dump_python(v[i], out);
      }
      out += ']';
      break;
    }
    case json::value_t::string: {
      const std::string& s = v.get_ref<const std::string&>();
      out += '"';
      for (unsigned char c : s) {
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          default:
            ANVIL_CHECK(c >= 0x20 && c < 0x80, "MDS index strings must be ASCII, got byte {:#x}", c);
            out += static_cast<char>(c);
        }
      }
      out += '"';
      break;
    }
    case json::value_t::null: out += "null"; break;
    case json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: out += v.dump(); break;
    default: ANVIL_FAIL("internal: unexpected JSON value in an MDS index");
  }
}

std::string python_json(const json& v) {
  std::string out;
  dump_python(v, out);
  return out;
}

// A file's index entry, the file given as its parts in order (joined only to be hashed).
json file_info_json(const std::string& basename, std::initializer_list<std::string_view> parts,
                    const std::vector<std::string>& hashes) {
  size_t bytes = 0;
  for (const std::string_view part : parts) bytes += part.size();
  json h = json::object();
  if (!hashes.empty()) {
    std::string whole;
    whole.reserve(bytes);
    for (const std::string_view part : parts) whole += part;
    for (const std::string& algo : hashes) h[algo] = mds_hash(algo, whole.data(), whole.size());
  }
  return json{{"basename", basename}, {"bytes", bytes}, {"hashes", h}};
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// MDS ndarray dtype codes and their element sizes.
int dtype_code(std::string_view name) {
  static const std::pair<std::string_view, int> kCodes[] = {
      {"uint8", 8}, {"int8", 9}, {"uint16", 16}, {"int16", 17}, {"uint32", 32},
      {"int32", 33}, {"uint64", 64}, {"int64", 65}};
  for (auto& [n, c] : kCodes)
    if (n == name) return c;
  return -1;
}
int dtype_bytes(int code) {
  switch (code) {
    case 8: case 9: return 1;
    case 16: case 17: return 2;
    case 32: case 33: return 4;
    case 64: case 65: return 8;
    default: return 0;
  }
}
int64_t load_int(const uint8_t* p, int code) {
  switch (code) {
    case 8: return p[0];
    case 9: return static_cast<int8_t>(p[0]);
    case 16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case 17: { int16_t v; std::memcpy(&v, p, 2); return v; }
    case 32: return load_u32(p);
    case 33: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case 64: { uint64_t v; std::memcpy(&v, p, 8); return static_cast<int64_t>(v); }
    default: { int64_t v; std::memcpy(&v, p, 8); return v; }
  }
}

}  // namespace

int64_t MdsIndex::num_samples() const {
  int64_t n = 0;
  for (const auto& s : shards) n += s.samples;
  return n;
}

bool mds_hash_supported(std::string_view algo) {
  if (algo == "xxh32" || algo == "xxh64" || algo == "xxh3_64" || algo == "xxh128" || algo == "xxh3_128") return true;
  return EVP_get_digestbyname(std::string(algo).c_str()) != nullptr;
}

std::string mds_hash(std::string_view algo, const void* data, size_t bytes) {
  auto hex = [](const unsigned char* p, size_t n) {
    static const char* kDigits = "0123456789abcdef";
    std::string s(2 * n, '0');
    for (size_t i = 0; i < n; i++) s[2 * i] = kDigits[p[i] >> 4], s[2 * i + 1] = kDigits[p[i] & 15];
    return s;
  };
  if (algo == "xxh32") {
    XXH32_canonical_t c;
    XXH32_canonicalFromHash(&c, XXH32(data, bytes, 0));
    return hex(c.digest, sizeof c.digest);
  }
  if (algo == "xxh64") {
    XXH64_canonical_t c;
    XXH64_canonicalFromHash(&c, XXH64(data, bytes, 0));
    return hex(c.digest, sizeof c.digest);
  }
  if (algo == "xxh3_64") {
    XXH64_canonical_t c;
    XXH64_canonicalFromHash(&c, XXH3_64bits(data, bytes));
    return hex(c.digest, sizeof c.digest);
  }
  if (algo == "xxh128" || algo == "xxh3_128") {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits(data, bytes));
    return hex(c.digest, sizeof c.digest);
  }
  const EVP_MD* md = EVP_get_digestbyname(std::string(algo).c_str());
  ANVIL_CHECK(md != nullptr, "unknown hash algorithm '{}' (expected xxh32, xxh64, xxh3_64, xxh128, md5, sha1, "
              "sha256, ...)", algo);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  ANVIL_CHECK(EVP_Digest(data, bytes, out, &n, md, nullptr) == 1, "hash '{}' failed", algo);
  return hex(out, n);
}

std::string mds_decompress(std::string_view compression, std::string_view data, int64_t raw_bytes,
                           const std::string& where) {
  const std::string_view algo = compression.substr(0, compression.find(':'));
  ANVIL_CHECK(algo == "zstd", "{}: compression '{}' is not supported (anvil reads and writes zstd)", where,
              compression);
  std::string out(static_cast<size_t>(raw_bytes), '\0');
  const size_t n = ZSTD_decompress(out.data(), out.size(), data.data(), data.size());
  ANVIL_CHECK(!ZSTD_isError(n), "{}: zstd decompression failed: {}", where, ZSTD_getErrorName(n));
  ANVIL_CHECK(static_cast<int64_t>(n) == raw_bytes, "{}: decompressed to {} bytes, the index says {}", where, n,
              raw_bytes);
  return out;
}

MdsIndex parse_mds_index(std::string_view text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    ANVIL_FAIL("{}: not valid JSON ({})", where, e.what());
  }
  auto fail = [&](const std::string& what) -> void { ANVIL_FAIL("{}: {}", where, what); };
  try {
    if (!j.is_object() || !j.contains("version") || j["version"] != 2)
      fail("not an MDS v2 index (expected {\"version\": 2, \"shards\": [...]})");
    if (!j.contains("shards") || !j["shards"].is_array()) fail("no \"shards\" list");
    MdsIndex index;
    auto file_info = [&](const json& f, size_t i) {
      MdsFileInfo info;
      info.basename = f.at("basename").get<std::string>();
      ANVIL_CHECK(!info.basename.empty() && info.basename.find('/') == std::string::npos &&
                  info.basename.find("..") == std::string::npos,
                  "{}: shard {} has an unsafe basename '{}'", where, i, info.basename);
      info.bytes = f.at("bytes").get<int64_t>();
      ANVIL_CHECK(info.bytes >= 0, "{}: shard {} has a negative size", where, i);
      if (f.contains("hashes") && f["hashes"].is_object())
        for (auto it = f["hashes"].begin(); it != f["hashes"].end(); ++it)
          info.hashes.emplace_back(it.key(), it.value().get<std::string>());
      return info;
    };
    for (size_t i = 0; i < j["shards"].size(); i++) {
      const json& s = j["shards"][i];
      if (s.value("format", std::string()) != "mds")
        fail(fmt::format("shard {} has format '{}' (anvil reads \"mds\")", i, s.value("format", std::string("?"))));
      if (s.value("version", 0) != 2) fail(fmt::format("shard {} is not MDS version 2", i));
      MdsShardInfo sh;
      sh.raw = file_info(s.at("raw_data"), i);
      if (s.contains("zip_data") && !s["zip_data"].is_null()) sh.zip = file_info(s["zip_data"], i);
      if (s.contains("compression") && !s["compression"].is_null()) sh.compression = s["compression"].get<std::string>();
      if (sh.zip && sh.compression.empty()) fail(fmt::format("shard {} has zip_data but no compression", i));
      sh.samples = s.at("samples").get<int64_t>();
      if (sh.samples < 0) fail(fmt::format("shard {} has a negative sample count", i));
      sh.column_names = s.at("column_names").get<std::vector<std::string>>();
      sh.column_encodings = s.at("column_encodings").get<std::vector<std::string>>();
      for (const json& c : s.at("column_sizes")) sh.column_sizes.push_back(c.is_null() ? -1 : c.get<int64_t>());
      if (sh.column_names.size() != sh.column_encodings.size() || sh.column_names.size() != sh.column_sizes.size())
        fail(fmt::format("shard {}: column_names, column_encodings and column_sizes differ in length", i));
      if (s.contains("size_limit") && !s["size_limit"].is_null()) sh.size_limit = s["size_limit"].get<int64_t>();
      if (s.contains("hashes")) sh.hashes = s["hashes"].get<std::vector<std::string>>();
      index.shards.push_back(std::move(sh));
    }
    return index;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    ANVIL_FAIL("{}: malformed MDS index ({})", where, e.what());
  }
}

const char* mds_sample_kind_name(MdsSampleKind kind) {
  return kind == MdsSampleKind::kTokens ? "tokens" : "turns";
}

MdsColumnLayout mds_column_layout(const MdsShardInfo& shard, const std::string& where) {
  MdsColumnLayout l;
  int turns = -1;
  for (size_t c = 0; c < shard.column_names.size(); c++) {
    l.fixed_sizes.push_back(shard.column_sizes[c]);
    if (shard.column_sizes[c] < 0) l.num_variable++;
    if (shard.column_names[c] == "tokens") l.column = static_cast<int>(c);
    if (shard.column_names[c] == "turns") turns = static_cast<int>(c);
  }
  if (l.column < 0 && turns >= 0) {
    l.kind = MdsSampleKind::kTurns;
    l.column = turns;
    ANVIL_CHECK(shard.column_encodings[turns] == "json", "{}: the turns column is encoded as '{}'; LLM Foundry's "
                "tokenized fine-tuning data is 'json'", where, shard.column_encodings[turns]);
  }
  if (l.column < 0) {
    ANVIL_FAIL("{}: no \"tokens\" or \"turns\" column (columns: {}); anvil trains on tokenized data: run `anvil "
               "data prepare` on the text (--format finetuning for prompt/response records)", where,
               fmt::join(shard.column_names, ", "));
  }
  if (shard.column_sizes[l.column] < 0) {
    l.variable_ordinal = 0;
    for (int c = 0; c < l.column; c++) l.variable_ordinal += shard.column_sizes[c] < 0;
  }
  if (l.kind == MdsSampleKind::kTurns) return l;
  // "ndarray", "ndarray:dtype" or "ndarray:dtype:d0,d1,..."
  const std::string& enc = shard.column_encodings[l.column];
  auto bad = [&] {
    ANVIL_FAIL("{}: the tokens column is encoded as '{}'; anvil reads 'ndarray[:int type[:shape]]'", where, enc);
  };
  if (enc.rfind("ndarray", 0) != 0) bad();
  std::string rest = enc.size() > 7 ? enc.substr(8) : "";
  if (enc.size() > 7 && enc[7] != ':') bad();
  if (!rest.empty()) {
    const size_t colon = rest.find(':');
    l.dtype_code = dtype_code(rest.substr(0, colon));
    if (l.dtype_code < 0) bad();
    if (colon != std::string::npos) {
      int64_t n = 1;
      std::string dims = rest.substr(colon + 1);
      size_t pos = 0;
      while (pos <= dims.size()) {
        size_t comma = dims.find(',', pos);
        if (comma == std::string::npos) comma = dims.size();
        const std::string d = dims.substr(pos, comma - pos);
        if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos) bad();
        n *= std::stoll(d);
        pos = comma + 1;
      }
      l.fixed_elements = n;
    }
  }
  return l;
}

MdsShardFile::MdsShardFile(const std::string& path, const MdsShardInfo& info)
    : path_(path),
      file_(path, "shard"),
      data_(reinterpret_cast<const uint8_t*>(file_.bytes().data())),
      size_(file_.bytes().size()) {
  auto fail = [&](const std::string& what) { ANVIL_FAIL("shard '{}': {}", path, what); };
  if (static_cast<int64_t>(size_) != info.raw.bytes)
    fail(fmt::format("{} bytes, the index says {} (truncated or replaced?)", size_, info.raw.bytes));
  if (size_ < 8) fail("too short to hold an MDS header");
  num_samples_ = load_u32(data_);
  if (num_samples_ != info.samples)
    fail(fmt::format("holds {} samples, the index says {} (not an MDS shard, or the wrong one)", num_samples_, info.samples));
  const size_t header = 4 + 4 * (static_cast<size_t>(num_samples_) + 1);
  if (header > size_) fail("the offset table runs past the end of the file");
  uint32_t prev = load_u32(data_ + 4);
  if (prev < header) fail("the first sample starts inside the header (not an MDS shard)");
  for (int64_t i = 1; i <= num_samples_; i++) {
    const uint32_t o = load_u32(data_ + 4 + 4 * i);
    if (o < prev) fail(fmt::format("sample offsets decrease at sample {}", i));
    prev = o;
  }
  if (prev != size_) fail(fmt::format("the last sample ends at byte {}, the file has {}", prev, size_));
  // The config JSON sits between the offsets and the first sample; check it is this shard's.
  const std::string_view cfg(reinterpret_cast<const char*>(data_) + header, load_u32(data_ + 4) - header);
  try {
    const json c = json::parse(cfg);
    if (c.value("format", std::string()) != "mds" || c.value("version", 0) != 2 ||
        c.at("column_names").get<std::vector<std::string>>() != info.column_names)
      fail("the embedded config disagrees with the index");
  } catch (const Error&) {
    throw;
  } catch (const std::exception&) {
    fail("the embedded config is not valid JSON (wrong magic: not an MDS shard)");
  }
}

std::span<const uint8_t> MdsShardFile::sample(int64_t i) const {
  const uint32_t b = load_u32(data_ + 4 + 4 * i), e = load_u32(data_ + 8 + 4 * i);
  return {data_ + b, data_ + e};
}

std::span<const uint8_t> MdsShardFile::column(int64_t i, const MdsColumnLayout& l) const {
  const std::span<const uint8_t> s = sample(i);
  auto fail = [&](const char* what) { ANVIL_FAIL("shard '{}', sample {}: {}", path_, i, what); };
  const size_t head = 4 * static_cast<size_t>(l.num_variable);
  if (s.size() < head) fail("shorter than its size header");
  // Find the column's bytes: fixed columns take their size, variable ones the header's.
  size_t pos = head, len = 0;
  int var = 0;
  for (int c = 0; c <= l.column; c++) {
    size_t sz;
    if (l.fixed_sizes[c] >= 0) {
      sz = static_cast<size_t>(l.fixed_sizes[c]);
    } else {
      sz = load_u32(s.data() + 4 * var++);
    }
    if (c == l.column) len = sz;
    else pos += sz;
  }
  if (pos + len > s.size()) fail("its columns run past the sample's end");
  return s.subspan(pos, len);
}

int64_t MdsShardFile::tokens(int64_t i, const MdsColumnLayout& l, int32_t* out, int64_t max_tokens) const {
  auto fail = [&](const char* what) { ANVIL_FAIL("shard '{}', sample {}: {}", path_, i, what); };
  ANVIL_CHECK(l.kind == MdsSampleKind::kTokens, "shard '{}' holds fine-tuning turns, not a token array", path_);
  const std::span<const uint8_t> col = column(i, l);
  const uint8_t* p = col.data();
  const uint8_t* end = p + col.size();
  int code = l.dtype_code;
  if (code < 0) {
    if (p >= end) fail("empty tokens column");
    code = *p++;
    if (dtype_bytes(code) == 0) fail("the tokens column is not an integer array");
  }
  int64_t count = l.fixed_elements;
  if (count < 0) {
    if (p >= end) fail("empty tokens column");
    const int ndim = *p >> 2, shape_bytes = 1 << (*p & 3);
    p++;
    if (p + static_cast<size_t>(ndim) * shape_bytes > end) fail("truncated ndarray shape");
    count = 1;
    for (int d = 0; d < ndim; d++, p += shape_bytes)
      count *= shape_bytes == 1 ? p[0] : shape_bytes == 2 ? load_int(p, 16) : shape_bytes == 4 ? load_int(p, 32)
                                                                                            : load_int(p, 64);
  }
  const int eb = dtype_bytes(code);
  if (static_cast<int64_t>(end - p) != count * eb) fail("the tokens array's size disagrees with its shape");
  const int64_t n = std::min(count, max_tokens);
  if (code == 33) {
    std::memcpy(out, p, static_cast<size_t>(n) * 4);
  } else {
    for (int64_t k = 0; k < n; k++) out[k] = static_cast<int32_t>(load_int(p + k * eb, code));
  }
  return count;
}

namespace {
json column_names(MdsSampleKind kind) { return {mds_sample_kind_name(kind)}; }
json column_encodings(MdsSampleKind kind) { return {kind == MdsSampleKind::kTokens ? "ndarray:int32" : "json"}; }
}  // namespace

MdsWriter::MdsWriter(std::string dir, MdsWriterOptions opt, MdsSampleKind kind)
    : dir_(std::move(dir)), opt_(std::move(opt)), kind_(kind) {
  if (!opt_.compression.empty()) {
    const std::string algo = opt_.compression.substr(0, opt_.compression.find(':'));
    ANVIL_CHECK(algo == "zstd", "compression '{}' is not supported (expected zstd or zstd:LEVEL)", opt_.compression);
    if (algo.size() < opt_.compression.size()) {
      const std::string level = opt_.compression.substr(5);
      ANVIL_CHECK(!level.empty() && level.find_first_not_of("0123456789") == std::string::npos &&
                  std::stoi(level) >= 1 && std::stoi(level) <= 22,
                  "compression '{}': the zstd level must be 1 to 22", opt_.compression);
    }
  }
  ANVIL_CHECK(std::is_sorted(opt_.hashes.begin(), opt_.hashes.end()) &&
              std::adjacent_find(opt_.hashes.begin(), opt_.hashes.end()) == opt_.hashes.end(),
              "hashes must be unique and sorted (as MDS requires), got {}", fmt::join(opt_.hashes, ","));
  for (const auto& h : opt_.hashes) ANVIL_CHECK(mds_hash_supported(h), "unknown hash algorithm '{}'", h);
  ANVIL_CHECK(opt_.size_limit > 0 && opt_.size_limit < (int64_t{1} << 32),
              "shard size limit must be between 1 byte and 4 GiB (offsets are 32-bit), got {}", opt_.size_limit);
  json cfg = {{"version", 2}, {"format", "mds"},
              {"compression", opt_.compression.empty() ? json(nullptr) : json(opt_.compression)},
              {"hashes", opt_.hashes}, {"size_limit", opt_.size_limit},
              {"column_names", column_names(kind_)}, {"column_encodings", column_encodings(kind_)},
              {"column_sizes", {nullptr}}};
  config_json_ = python_json(cfg);
  shard_size_ = 8 + static_cast<int64_t>(config_json_.size());
}

void MdsWriter::write_tokens(const int32_t* tokens, int64_t n) {
  ANVIL_CHECK(kind_ == MdsSampleKind::kTokens, "internal: token arrays written to a turns dataset");
  ANVIL_CHECK(n > 0, "an MDS ndarray sample needs at least one token");
  // [ndim<<2 | shape type][shape][int32 values]
  const int shape_code = n < (1 << 8) ? 0 : n < (1 << 16) ? 1 : n < (int64_t{1} << 32) ? 2 : 3;
  const size_t shape_bytes = size_t{1} << shape_code;
  char head[9];
  head[0] = static_cast<char>((1 << 2) | shape_code);
  const uint64_t dim = static_cast<uint64_t>(n);
  std::memcpy(head + 1, &dim, shape_bytes);  // little-endian: the low bytes of the dimension
  append({std::string_view(head, 1 + shape_bytes),
          std::string_view(reinterpret_cast<const char*>(tokens), static_cast<size_t>(n) * 4)});
}

void MdsWriter::write_json(const json& sample) {
  ANVIL_CHECK(kind_ == MdsSampleKind::kTurns, "internal: json written to a token dataset");
  append({python_json(sample)});  // streaming's json encoding: json.dumps's spacing
}

// One sample: [u32 column size][column bytes], the column given in parts (copied once, into the
// shard's buffer).
void MdsWriter::append(std::initializer_list<std::string_view> column) {
  size_t size = 0;
  for (const std::string_view part : column) size += part.size();
  ANVIL_CHECK(size < (size_t{1} << 31), "an MDS sample of {} bytes is too large", size);
  const uint32_t column_bytes = static_cast<uint32_t>(size);
  const int64_t sample_bytes = 4 + column_bytes;
  if (shard_size_ + sample_bytes + 4 > opt_.size_limit && !sample_sizes_.empty()) flush_shard();
  // A shard's worth at once (up to 256 MiB; pages are touched only as written): growing by
  // doubling copied the first shard again.
  const size_t shard_bytes = static_cast<size_t>(std::min(opt_.size_limit, int64_t{1} << 28));
  if (samples_.capacity() < shard_bytes) samples_.reserve(shard_bytes);
  samples_.append(reinterpret_cast<const char*>(&column_bytes), 4);
  for (const std::string_view part : column) samples_.append(part);
  sample_sizes_.push_back(static_cast<uint32_t>(sample_bytes));
  shard_size_ += sample_bytes + 4;
}

void MdsWriter::flush_shard() {
  const uint32_t n = static_cast<uint32_t>(sample_sizes_.size());
  // The shard is this header ([u32 n][n + 1 u32 offsets][config]) and then the samples.
  std::string header;
  header.reserve(4 + 4 * (n + 1) + config_json_.size());
  header.append(reinterpret_cast<const char*>(&n), 4);
  uint32_t off = 4 + 4 * (n + 1) + static_cast<uint32_t>(config_json_.size());
  header.append(reinterpret_cast<const char*>(&off), 4);
  for (uint32_t s : sample_sizes_) {
    off += s;
    header.append(reinterpret_cast<const char*>(&off), 4);
  }
  header += config_json_;
  const std::string raw_name = fmt::format("shard.{:05d}.mds", shards_.size());
  json entry = {{"samples", n}, {"raw_data", file_info_json(raw_name, {header, samples_}, opt_.hashes)},
                {"zip_data", nullptr},
                {"version", 2}, {"format", "mds"},
                {"compression", opt_.compression.empty() ? json(nullptr) : json(opt_.compression)},
                {"hashes", opt_.hashes}, {"size_limit", opt_.size_limit}, {"column_names", column_names(kind_)},
                {"column_encodings", column_encodings(kind_)}, {"column_sizes", {nullptr}}};
  // The file: the shard's two parts as they are, or the zstd frame of the whole.
  std::vector<std::string_view> stored = {header, samples_};
  std::string stored_name = raw_name, zip;
  if (!opt_.compression.empty()) {
    const size_t colon = opt_.compression.find(':');
    const int level = colon == std::string::npos ? 3 : std::stoi(opt_.compression.substr(colon + 1));
    const std::string raw = header + samples_;
    zip.resize(ZSTD_compressBound(raw.size()));
    const size_t zn = ZSTD_compress(zip.data(), zip.size(), raw.data(), raw.size(), level);
    ANVIL_CHECK(!ZSTD_isError(zn), "zstd compression failed: {}", ZSTD_getErrorName(zn));
    zip.resize(zn);
    stored_name = raw_name + ".zstd";
    entry["zip_data"] = file_info_json(stored_name, {zip}, opt_.hashes);
    stored = {zip};
  }
  AtomicFile f(dir_ + "/" + stored_name);
  for (const std::string_view part : stored) {
    f.write(part.data(), part.size());
    bytes_written_ += static_cast<int64_t>(part.size());
  }
  f.commit();
  shards_.push_back(python_json(entry));
  samples_.clear();
  sample_sizes_.clear();
  shard_size_ = 8 + static_cast<int64_t>(config_json_.size());
}

int64_t MdsWriter::finish() {
  if (!sample_sizes_.empty()) flush_shard();
  std::string index = "{\"shards\": [";
  for (size_t i = 0; i < shards_.size(); i++) index += (i ? ", " : "") + shards_[i];
  index += "], \"version\": 2}";
  write_file_atomic(dir_ + "/index.json", index);
  bytes_written_ += static_cast<int64_t>(index.size());
  return bytes_written_;
}

}  // namespace anvil
