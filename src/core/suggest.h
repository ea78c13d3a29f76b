// "Did you mean": the nearest of a set of valid names to a mistyped one, for error messages about
// unknown commands, flags and config keys.
#pragma once
#include <string>
#include <vector>

namespace anvil {

// The candidate closest to `word` by edit distance (insertions, deletions, substitutions and
// swaps of neighbours), when it is close enough to be a typo: at most a third of the word's
// length, and at least 1. "" when none is; the first of equally near candidates.
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

// " (did you mean 'NAME'?)", or "" when no candidate is near.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace anvil
