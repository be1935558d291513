# The attention family (issue 4): score × distribution × masks, forward and backward.
target_sources(attn PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/front.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernels.cc
  ${CMAKE_CURRENT_LIST_DIR}/tiled.cc
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
)
