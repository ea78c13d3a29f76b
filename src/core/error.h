// Errors: every failure anvil reports is an anvil::Error carrying one line a user can act on (a
// config's unknown keys are listed together, a line each).
// Library code throws; only main() catches, prints and exits non-zero.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace anvil {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace anvil

// ANVIL_CHECK(cond, "message {}", args...): for invariants and user input alike. The message is
// formatted only when the check fails.
#define ANVIL_CHECK(cond, ...)                                                     \
  do {                                                                             \
    if (!(cond)) [[unlikely]] ::anvil::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define ANVIL_FAIL(...) ::anvil::throw_error(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
