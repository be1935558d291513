# The linear op y = x Wᵀ + b (include/attn/linear.h): front, float64 reference, OpenBLAS path.
# OpenBLAS is opened at run time (dlopen), so it is not a link dependency.
target_sources(attn PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/linear.cc
  ${CMAKE_CURRENT_LIST_DIR}/reference.cc
  ${CMAKE_CURRENT_LIST_DIR}/blas.cc
)
target_link_libraries(attn PRIVATE ${CMAKE_DL_LIBS})
