# mpirun_anvil NP CMD...: Open MPI's mpirun for tests on one machine. --oversubscribe lets ranks
# outnumber cores; running as root (CI containers) must be allowed explicitly.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
mpirun_anvil() {
  local np="$1"; shift
  mpirun -np "$np" --oversubscribe --bind-to none "$@"
}
