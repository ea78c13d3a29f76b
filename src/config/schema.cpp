#include "config/schema.h"

namespace anvil {

std::string key_docs_markdown(const std::vector<KeyDoc>& rows) {
  std::string out = "| key | default | meaning |\n|---|---|---|\n";
  for (const KeyDoc& row : rows) {
    // "a.b, c": the first key carries the section's dotted name, the ones after it are its siblings.
    std::string keys;
    size_t start = 0;
    while (start <= row.key.size()) {
      size_t end = row.key.find(", ", start);
      if (end == std::string::npos) end = row.key.size();
      keys += (keys.empty() ? "`" : ", `") + row.key.substr(start, end - start) + "`";
      start = end + 2;
    }
    out += "| " + keys + " | " + row.default_text + " | " + row.meaning + " |\n";
  }
  return out;
}

}  // namespace anvil
