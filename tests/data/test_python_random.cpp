// PythonRandom and PythonIntSet against CPython: tests/data/fewshot_golden.json holds what
// Python's random.Random, random.sample and set order give (fewshot_golden.py wrote it), among
// them LLM Foundry's few-shot draws for the published tasks' sizes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/fs.h"
#include "data/python_random.h"

namespace anvil {
namespace {

using json = nlohmann::json;

json golden() {
  const char* src = std::getenv("ANVIL_SOURCE_DIR");
  return json::parse(read_file(std::string(src ? src : ".") + "/tests/data/fewshot_golden.json"));
}

TEST(PythonRandom, DrawsAsCPython) {
  const json g = golden();  // held: a range-for over golden()["draws"] would outlive the temporary
  for (const json& d : g["draws"]) {
    PythonRandom rng(d["seed"].get<uint64_t>());
    std::vector<uint32_t> bits;
    for (size_t i = 0; i < d["bits32"].size(); i++) bits.push_back(rng.bits(32));  // past one 624-word refill
    EXPECT_EQ(bits, d["bits32"].get<std::vector<uint32_t>>()) << "seed " << d["seed"];
    PythonRandom again(d["seed"].get<uint64_t>());
    EXPECT_EQ(again.sample_range(1000, 50), d["sample_1000_50"].get<std::vector<int64_t>>()) << "seed " << d["seed"];
  }
}

TEST(PythonRandom, FewshotIndicesAreFoundrysInSetOrder) {
  const json g = golden();
  for (const json& c : g["cases"]) {
    const int64_t n = c["n"], shots = c["shots"];
    PythonRandom rng(c["seed"].get<uint64_t>());
    for (size_t i = 0; i < c["fewshot"].size(); i++)
      ASSERT_EQ(fewshot_indices(n, shots, static_cast<int64_t>(i), rng), c["fewshot"][i].get<std::vector<int64_t>>())
          << "n " << n << ", " << shots << " shots, seed " << c["seed"] << ", example " << i;
  }
}

TEST(PythonIntSet, ResizesAndReusesRemovedSlotsAsCPython) {
  // {0..19} less the evens, then 66, 130, 100 and 4 added: CPython 3.11 iterates as below (a key
  // probing past removed slots goes to the last one it passed, set_add_entry's freeslot).
  PythonIntSet s;
  for (int64_t i = 0; i < 20; i++) s.add(i);
  for (int64_t i = 0; i < 20; i += 2) s.remove(i);
  for (const int64_t i : {66, 130, 100, 4}) s.add(i);
  EXPECT_EQ(s.size(), 14);
  EXPECT_EQ(s.items(), (std::vector<int64_t>{1, 3, 5, 7, 9, 11, 4, 13, 15, 17, 130, 19, 66, 100}));
}

}  // namespace
}  // namespace anvil
