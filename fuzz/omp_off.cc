// fuzz/omp_off.cc — the OpenMP queries the library makes, for the ThreadSanitizer build, which
// compiles without -fopenmp and links no OpenMP runtime: libomp is not built for TSan, and its
// thread-local set-up (or its barriers) would be reported as races. One thread each: without
// -fopenmp every parallel region runs on the calling thread, as thread 0.
extern "C" int omp_get_max_threads() { return 1; }
extern "C" int omp_get_num_procs() { return 1; }
extern "C" int omp_get_thread_num() { return 0; }
extern "C" int omp_get_num_threads() { return 1; }
