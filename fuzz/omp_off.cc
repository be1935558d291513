// fuzz/omp_off.cc — the two OpenMP queries the library makes, for the ThreadSanitizer build,
// which compiles without -fopenmp and links no OpenMP runtime: libomp is not built for TSan,
// and its thread-local set-up (or its barriers) would be reported as races. One thread each.
extern "C" int omp_get_max_threads() { return 1; }
extern "C" int omp_get_num_procs() { return 1; }
