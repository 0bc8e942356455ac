// Ranks of one job launched with different arguments (mpirun -np 2 sh -c 'kiln generate --tp 2
// --seed $OMPI_COMM_WORLD_RANK', or another --model, --steps or size per rank) compute different
// things: another seed silently gives an image no single process would, another size or step
// count issues collectives that do not match (MPI_ERR_TRUNCATE, or a wait until the collective
// timeout). So before any work the ranks compare their command lines.
#pragma once
#include <string>
#include <vector>

#include "distributed/process_group.h"

namespace kiln {

// Collective over `group`, called by every rank before anything else: a no-op for one rank; when
// any rank's `args` (the arguments after the subcommand `command`) differ from rank 0's, a
// kiln::Error on every rank, the same line on each, naming the first argument that differs, its
// value on both ranks and every rank that differs. Two all_gathers of fixed sizes (each rank's
// length first), so different lengths cannot truncate a message. `per_rank_flags` (e.g.
// "--device-memory", one rank's own device) and their values may differ and are not compared.
void check_same_arguments(ProcessGroup& group, const std::string& command, const std::vector<std::string>& args,
                          const std::vector<std::string>& per_rank_flags = {});

}  // namespace kiln
