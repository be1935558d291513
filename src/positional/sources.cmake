# Positional encodings: front, float64 reference, fast paths.
target_sources(attn PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/positional.cc
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernels.cc
)
