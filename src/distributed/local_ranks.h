// Tensor-parallel ranks as threads of one process, for a device whose several devices one process
// drives (a PJRT plugin's: XLA's CPU plugin, a TPU host's chips). Each rank is a thread that runs
// the same work as an mpirun rank would — its own pipeline, its own slices of the weights, on its
// own device — and sees its in-process group as ProcessGroup::world(). Host collectives between
// the threads copy through shared memory; a device that runs collectives inside its programs
// (PJRT) uses the group to gather every rank's arguments and run one program for all of them.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "distributed/process_group.h"

namespace kiln {

// `size` groups of one in-process world, rank r's at index r. Their collectives wait at most
// KILN_COLLECTIVE_TIMEOUT seconds (as MPI's), then fail naming the rank and the collective; after
// abort() every rank's pending and later collectives fail at once with the reason, so a rank that
// stopped never leaves the others waiting.
std::vector<std::shared_ptr<ProcessGroup>> local_world(int size);

// Makes `group` this thread's ProcessGroup::world() until the guard ends.
class ScopedWorld {
 public:
  explicit ScopedWorld(std::shared_ptr<ProcessGroup> group);
  ~ScopedWorld();
  ScopedWorld(const ScopedWorld&) = delete;
  ScopedWorld& operator=(const ScopedWorld&) = delete;

 private:
  std::shared_ptr<ProcessGroup> previous_;
};

// Runs `rank_main(r)` for r in 0..size-1, each on a thread of its own whose world() is rank r of
// a local_world(size), and waits for all. When a rank throws, the others' collectives are aborted
// and the first rank's error is rethrown here (not the "another rank stopped" errors it caused).
void run_local_ranks(int size, const std::function<void(int rank)>& rank_main);

}  // namespace kiln
