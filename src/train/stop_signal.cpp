#include "train/stop_signal.h"

#include <csignal>
#include <initializer_list>

namespace anvil {
namespace {

volatile std::sig_atomic_t g_requested = 0;

extern "C" void on_stop_signal(int signo) {
  if (g_requested != 0 && signo == SIGINT) {
    // A second Ctrl-C: stop now, as the default action would.
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  if (g_requested == 0) g_requested = signo;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking read or wait resumes; the step in progress finishes
  for (int s : {SIGTERM, SIGINT, SIGUSR1}) sigaction(s, &sa, nullptr);
}

int stop_requested() { return g_requested; }

const char* signal_name(int signo) {
  switch (signo) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace anvil
