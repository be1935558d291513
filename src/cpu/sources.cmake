# src/cpu — the fused CPU backend. Each ISA level is its own translation unit with its own
# flags, compiling the kernel body (kernel_body.h: simd.h, tile.h, scores.h, prefill.h,
# decode.h; simd_avx512bf16.h for the last level); the driver and the runtime dispatch (isa.cc)
# and the mask fill (mask_fill.cc) are built for baseline x86-64. The row-wise kernels (rowwise.h: GELU, LayerNorm) are a
# second table built the same way from rowwise_body.h, and the fused family kernels
# (family_kernels.h, driven by src/family/fused.cc) a third, from family_body.h (its
# avx512bf16 level adds the bf16 forward of dot scores).
# ATTN_CPU_MAX_LEVEL (0 generic, 1 avx2, 2 avx512, 3 avx512bf16 and amx; default 3) leaves the
# levels above it out of a build (isa.cc then never picks them): fuzz/ builds up to avx2, for
# build time.
if(NOT DEFINED ATTN_CPU_MAX_LEVEL)
  set(ATTN_CPU_MAX_LEVEL 3)
endif()
set(ATTN_CPU_LEVELS generic avx2 avx512 avx512bf16)
math(EXPR n "${ATTN_CPU_MAX_LEVEL} + 1")
list(SUBLIST ATTN_CPU_LEVELS 0 ${n} ATTN_CPU_LEVELS)
target_sources(attn PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cpu_backend.cc ${CMAKE_CURRENT_LIST_DIR}/isa.cc
                            ${CMAKE_CURRENT_LIST_DIR}/mask_fill.cc
                            ${CMAKE_CURRENT_LIST_DIR}/bf16_words.cc ${CMAKE_CURRENT_LIST_DIR}/rows.cc)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/isa.cc PROPERTIES
  COMPILE_DEFINITIONS ATTN_CPU_MAX_LEVEL=${ATTN_CPU_MAX_LEVEL})
# One set of flags per ISA level, for both tables.
set(ATTN_ISA_FLAGS_generic "-ffp-contract=fast")
set(ATTN_ISA_FLAGS_avx2 "-mavx2;-mfma;-mf16c;-ffp-contract=fast")
set(ATTN_ISA_FLAGS_avx512 "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx2;-mfma;-mf16c;-ffp-contract=fast")
set(ATTN_ISA_FLAGS_avx512bf16 "-mavx512f;-mavx512bw;-mavx512vl;-mavx512dq;-mavx512bf16;-mavx512vnni;-mavx2;-mfma;-mf16c;-ffp-contract=fast")
# The amx level (isa.cc) is the avx512bf16 table with the bf16 prefill on AMX tiles (amx.h), and
# the family's avx512 table with its bf16 forward of dot scores on tiles (family_avx512bf16.cc):
# only those two units take the tile instructions.
set(ATTN_KERNEL_FLAGS_avx512bf16 "${ATTN_ISA_FLAGS_avx512bf16};-mamx-tile;-mamx-bf16")
foreach(isa IN LISTS ATTN_CPU_LEVELS)
  target_sources(attn PRIVATE ${CMAKE_CURRENT_LIST_DIR}/kernels_${isa}.cc)
  if(DEFINED ATTN_KERNEL_FLAGS_${isa})
    set(flags "${ATTN_KERNEL_FLAGS_${isa}}")
  else()
    set(flags "${ATTN_ISA_FLAGS_${isa}}")
  endif()
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/kernels_${isa}.cc PROPERTIES COMPILE_OPTIONS "${flags}")
  set(tables family)
  if(NOT isa STREQUAL "avx512bf16")  # no bf16 dot product in the row-wise kernels
    list(APPEND tables rowwise)
  endif()
  foreach(table IN LISTS tables)
    target_sources(attn PRIVATE ${CMAKE_CURRENT_LIST_DIR}/${table}_${isa}.cc)
    # (the family's avx512bf16 unit also holds the amx level's forward on tiles: the kernel flags)
    if(table STREQUAL "family" AND DEFINED ATTN_KERNEL_FLAGS_${isa})
      set(flags "${ATTN_KERNEL_FLAGS_${isa}}")
    else()
      set(flags "${ATTN_ISA_FLAGS_${isa}}")
    endif()
    set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/${table}_${isa}.cc PROPERTIES COMPILE_OPTIONS "${flags}")
  endforeach()
endforeach()
