# src/serving — varlen (packed) batches and the paged KV cache (include/attn/serving.h): fronts
# that run each sequence through the core op's backends on views of the caller's memory.
target_sources(attn PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/serving.cc
  ${CMAKE_CURRENT_LIST_DIR}/varlen.cc
  ${CMAKE_CURRENT_LIST_DIR}/paged.cc
  ${CMAKE_CURRENT_LIST_DIR}/paged_varlen.cc
)
