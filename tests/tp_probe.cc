// Fault probe for the tensor-parallel failure tests (tests/tp_fault.sh): under mpirun -np 2,
// rank 1 dies ("exit": killed without any cleanup, like a crash) or stops answering ("hang")
// while rank 0 waits in an all_reduce; "ok" is the healthy case.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "distributed/process_group.h"

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  auto pg = kiln::ProcessGroup::world();
  if (pg->rank() == 1 && mode == "exit") std::_Exit(3);
  if (pg->rank() == 1 && mode == "hang") std::this_thread::sleep_for(std::chrono::seconds(600));
  float x = float(pg->rank() + 1);
  pg->all_reduce_sum(&x, 1);
  std::printf("rank %d: sum %g\n", pg->rank(), double(x));
  return 0;
}
