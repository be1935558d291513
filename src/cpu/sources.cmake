# src/cpu — the fused CPU backend. Each ISA level is its own translation unit with its own
# flags, compiling the kernel body (kernel_body.h: simd.h, tile.h, scores.h, prefill.h,
# decode.h; simd_avx512bf16.h for the last level); the driver and the runtime dispatch (isa.cc)
# are built for baseline x86-64. The row-wise kernels (rowwise.h: GELU, LayerNorm) are a
# second table built the same way from rowwise_body.h.
target_sources(attn PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cpu_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/isa.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernels_generic.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernels_avx2.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernels_avx512.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernels_avx512bf16.cc
  ${CMAKE_CURRENT_LIST_DIR}/rowwise_generic.cc
  ${CMAKE_CURRENT_LIST_DIR}/rowwise_avx2.cc
  ${CMAKE_CURRENT_LIST_DIR}/rowwise_avx512.cc
)
# One set of flags per ISA level, for both tables.
set(ATTN_ISA_FLAGS_generic "-ffp-contract=fast")
set(ATTN_ISA_FLAGS_avx2 "-mavx2;-mfma;-mf16c;-ffp-contract=fast")
set(ATTN_ISA_FLAGS_avx512 "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c;-ffp-contract=fast")
set(ATTN_ISA_FLAGS_avx512bf16 "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16;-mavx2;-mfma;-mf16c;-ffp-contract=fast")
foreach(isa generic avx2 avx512 avx512bf16)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels_${isa}.cc PROPERTIES COMPILE_OPTIONS "${ATTN_ISA_FLAGS_${isa}}")
endforeach()
foreach(isa generic avx2 avx512)  # no bf16 dot product in the row-wise kernels
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/rowwise_${isa}.cc PROPERTIES COMPILE_OPTIONS "${ATTN_ISA_FLAGS_${isa}}")
endforeach()
