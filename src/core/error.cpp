// The single place errors are raised, so a debugger breakpoint here catches every one.
#include "core/error.h"

#include <cstdlib>

namespace anvil {

void throw_error(const char* file, int line, const std::string& message) {
  // Users read the message; developers can ask for the source location.
  if (std::getenv("ANVIL_DEBUG_ERRORS")) throw Error(fmt::format("{} [{}:{}]", message, file, line));
  throw Error(message);
}

}  // namespace anvil
