// In-process tensor-parallel ranks (distributed/local_ranks.h): threads whose world() is their
// rank, host collectives through shared memory, and a failing rank that stops the others instead
// of leaving them waiting.
#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "distributed/local_ranks.h"
#include "distributed/process_group.h"

namespace kiln {
namespace {

TEST(LocalRanks, EachThreadSeesItsRankAsTheWorld) {
  constexpr int kRanks = 4;
  std::vector<int> seen(kRanks, -1), sizes(kRanks, 0);
  std::vector<bool> in_process(kRanks, false);
  run_local_ranks(kRanks, [&](int rank) {
    const auto world = ProcessGroup::world();
    seen[size_t(rank)] = world->rank();
    sizes[size_t(rank)] = world->size();
    in_process[size_t(rank)] = world->in_process();
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(seen[size_t(r)], r);
    EXPECT_EQ(sizes[size_t(r)], kRanks);
    EXPECT_TRUE(in_process[size_t(r)]);
  }
  // Outside the ranks' threads the process's own world is back.
  EXPECT_EQ(ProcessGroup::world()->size(), 1);
}

TEST(LocalRanks, CollectivesCombineEveryRanksValues) {
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> sums(kRanks);
  std::vector<std::vector<int>> gathered(kRanks), broadcast(kRanks);
  run_local_ranks(kRanks, [&](int rank) {
    ProcessGroup& world = *ProcessGroup::world();
    for (int round = 0; round < 50; ++round) {  // the barrier is reused, round after round
      std::vector<float> x{float(rank + 1), float(10 * rank + round)};
      world.all_reduce_sum(x.data(), x.size());
      sums[size_t(rank)] = x;
    }
    const int mine[2] = {rank, rank * rank};
    gathered[size_t(rank)].resize(2 * kRanks);
    world.all_gather(mine, gathered[size_t(rank)].data(), sizeof(mine));
    std::vector<int> b(3, rank);
    if (rank == 1) b = {7, 8, 9};
    world.broadcast(b.data(), b.size() * sizeof(int), 1);
    broadcast[size_t(rank)] = b;
    const auto copy = world.duplicate();
    float one = 1.f;
    copy->all_reduce_sum(&one, 1);
    EXPECT_EQ(one, float(kRanks));
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(sums[size_t(r)], (std::vector<float>{1.f + 2.f + 3.f, 0.f + 10.f + 20.f + 3 * 49.f})) << "rank " << r;
    EXPECT_EQ(gathered[size_t(r)], (std::vector<int>{0, 0, 1, 1, 2, 4})) << "rank " << r;
    EXPECT_EQ(broadcast[size_t(r)], (std::vector<int>{7, 8, 9})) << "rank " << r;
  }
}

TEST(LocalRanks, AFailingRankStopsTheOthersAndItsErrorIsTheOneRaised) {
  std::atomic<int> stopped{0};
  try {
    run_local_ranks(3, [&](int rank) {
      if (rank == 2) fail("test", "rank 2 could not load its slices");
      try {
        ProcessGroup::world()->barrier();  // never completes: rank 2 is gone
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 2 stopped"), std::string::npos) << e.what();
        ++stopped;
        throw;
      }
    });
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "[test] rank 2 could not load its slices");
  }
  EXPECT_EQ(stopped.load(), 2);
}

}  // namespace
}  // namespace kiln
