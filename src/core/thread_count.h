// The most threads one parallel region of kiln's CPU work uses (--threads N): every thread that
// runs kernels (the calling thread, each CPU queue's worker) applies it with OpenMP before its
// next work, since OpenMP keeps the count per thread and a running process cannot change
// OMP_NUM_THREADS for threads it already has.
#pragma once

namespace kiln {

// n >= 1: at most n threads; 0: OpenMP's default (OMP_NUM_THREADS, else every core).
void set_thread_count(int n);
// Applies the count to the calling thread when it changed since its last call here.
void apply_thread_count();
// The threads a parallel region of the calling thread would use now.
int threads_in_use();

}  // namespace kiln
