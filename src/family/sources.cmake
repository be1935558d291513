# The attention family (issue 4): score × distribution × masks, forward and backward.
# front.cc: checks common to every score, the path, orchestration; scores/: one file per score
# (or group sharing its preparation), listed in scores/table.cc. linear.cc: linear attention
# (Katharopoulos et al. 2020), its own function beside the family.
target_sources(attn PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/front.cc
  ${CMAKE_CURRENT_LIST_DIR}/names.cc
  ${CMAKE_CURRENT_LIST_DIR}/kernels.cc
  ${CMAKE_CURRENT_LIST_DIR}/tiled.cc
  ${CMAKE_CURRENT_LIST_DIR}/fused.cc
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
  ${CMAKE_CURRENT_LIST_DIR}/linear.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/table.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/common.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/dot.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/general.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/additive.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/cosine.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/location.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/gaussian.cc
  ${CMAKE_CURRENT_LIST_DIR}/scores/box_triangle.cc
)
