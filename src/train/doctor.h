// `anvil doctor`: what this machine and build offer anvil, and short self-tests that the pieces
// work here (every kernel implementation against the reference ops, an exact all-reduce).
#pragma once

namespace anvil {

// Prints the report; returns the process exit code (1 when a self-test failed).
int run_doctor();

}  // namespace anvil
