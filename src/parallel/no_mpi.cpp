// Built when CMake finds no MPI: a launch that needs MPI is a clear error.
#include "core/error.h"
#include "parallel/communicator.h"

namespace anvil {

std::unique_ptr<Communicator> make_mpi_communicator(const LaunchInfo& li, bool) {
  ANVIL_FAIL("this anvil was built without MPI, but {} started it as one of {} tasks: install an MPI "
             "(Debian: libopenmpi-dev) and rebuild", li.launcher.empty() ? "a launcher" : li.launcher, li.env_world);
}

void end_job_on_error(const std::string&) {}  // one process: nothing else to end

}  // namespace anvil
