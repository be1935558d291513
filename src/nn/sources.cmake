# attn::nn (include/attn/nn): layers with explicit forward and backward, built on the ops.
target_sources(attn PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/parameter.cc
  ${CMAKE_CURRENT_LIST_DIR}/init.cc
  ${CMAKE_CURRENT_LIST_DIR}/linear.cc
  ${CMAKE_CURRENT_LIST_DIR}/embedding.cc
  ${CMAKE_CURRENT_LIST_DIR}/norm.cc
  ${CMAKE_CURRENT_LIST_DIR}/activation.cc
  ${CMAKE_CURRENT_LIST_DIR}/dropout.cc
  ${CMAKE_CURRENT_LIST_DIR}/gru.cc
  ${CMAKE_CURRENT_LIST_DIR}/multihead.cc
  ${CMAKE_CURRENT_LIST_DIR}/scored_attention.cc
  ${CMAKE_CURRENT_LIST_DIR}/loss.cc
  ${CMAKE_CURRENT_LIST_DIR}/optim.cc
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cc
  ${CMAKE_CURRENT_LIST_DIR}/transformer.cc
  ${CMAKE_CURRENT_LIST_DIR}/memory_network.cc
  ${CMAKE_CURRENT_LIST_DIR}/co_attention.cc
  ${CMAKE_CURRENT_LIST_DIR}/hierarchical.cc
)
