// Processes that compute together: one process per device,
// launched by mpirun (OpenMPI), ranks 0..size-1. Collectives here are blocking host calls on
// f32/byte buffers; models use them through the graph ops all_reduce / all_gather
// (exec/ops.h), which run them as kernels in every execution mode.
//
// A collective that does not complete within KILN_COLLECTIVE_TIMEOUT seconds (default 300;
// read once) prints an error naming the rank and the collective and aborts the whole job
// (MPI_Abort), so a rank that died or stopped answering never leaves the others hanging. A rank
// that exits is also noticed by mpirun, which then ends the others.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace kiln {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  // This process's world: MPI's COMM_WORLD when launched by mpirun (OMPI_COMM_WORLD_SIZE set),
  // else a single rank (no MPI initialised). Created on first use; MPI is finalised at exit. On a
  // thread that runs one of several in-process ranks (distributed/local_ranks.h), that rank's group.
  static std::shared_ptr<ProcessGroup> world();
  // A group that only knows its rank and size and cannot communicate: for loading and
  // checking a plan for another world size without launching it (tests, tools).
  static std::shared_ptr<ProcessGroup> detached(int rank, int size);

  int rank() const { return rank_; }
  int size() const { return size_; }

  virtual void all_reduce_sum(float* data, size_t count) = 0;  // in place
  // `in` (bytes_per_rank) from every rank, concatenated in rank order into `out`.
  virtual void all_gather(const void* in, void* out, size_t bytes_per_rank) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // A broadcast with no deadline, polling slowly: for a rank waiting for its next instruction
  // for as long as that takes (kiln serve's idle ranks; mpirun ends them if the root dies).
  virtual void broadcast_when_ready(void* data, size_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Whether every rank is a thread of this process, so a pointer means the same on each (the
  // in-process ranks of distributed/local_ranks.h; a single rank).
  virtual bool in_process() const { return size_ == 1; }
  // The same ranks on a communicator of their own (MPI_Comm_dup), whose collectives never match
  // this group's: host-side agreement (kiln serve's calls and cancellation) while the model's
  // collectives run on the device thread. Collective: every rank calls it at the same point.
  virtual std::shared_ptr<ProcessGroup> duplicate() = 0;
  // Ends every rank of the job now (an error on one rank must not leave the others waiting in
  // a collective); a no-op for a single rank.
  virtual void abort(int code) { (void)code; }
  std::string describe() const;  // "rank 1 of 2"

 protected:
  ProcessGroup(int rank, int size) : rank_(rank), size_(size) {}

 private:
  int rank_, size_;
};

// KILN_COLLECTIVE_TIMEOUT (seconds, default 300), read once: how long a collective may wait.
double collective_timeout_seconds();

// Work that must finish before MPI is finalised at exit: a device registers how to drain its
// queue, where collective kernels may still be waiting (devices include this layer, never the
// reverse). Run in registration order by the world's exit handler; their errors are ignored.
void before_world_finalize(std::function<void()> drain);

namespace detail {
std::shared_ptr<ProcessGroup> thread_world();  // the calling thread's in-process rank, or null
}  // namespace detail

}  // namespace kiln
