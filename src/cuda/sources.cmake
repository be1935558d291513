# src/cuda: the cuda backend (docs/ARCHITECTURE.md). ATTN_CUDA (on when nvcc is found) builds the
# kernels for ATTN_CUDA_ARCHITECTURES (sm_80 and sm_90 by default); off, stub.cc gives a backend that
# says why it cannot run. The library and every test build and pass without a GPU either way.
include(CheckLanguage)
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(attn_cuda_default ON)
else()
  set(attn_cuda_default OFF)
endif()
option(ATTN_CUDA "Build the cuda backend (needs nvcc)" ${attn_cuda_default})
set(ATTN_CUDA_ARCHITECTURES "80;90" CACHE STRING "CUDA architectures of the cuda backend's kernels")
if(ATTN_CUDA)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # The kernels build in an object library of their own: attn's PUBLIC cxx_std_20 would ask nvcc
  # for a CUDA20 dialect that CMake 3.25 cannot give it; the kernels need C++17.
  add_library(attn_cuda_kernels OBJECT cuda/forward.cu cuda/backward.cu)
  set_target_properties(attn_cuda_kernels PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                        CUDA_ARCHITECTURES "${ATTN_CUDA_ARCHITECTURES}" POSITION_INDEPENDENT_CODE ON)
  target_include_directories(attn_cuda_kernels PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_sources(attn PRIVATE cuda/driver.cc $<TARGET_OBJECTS:attn_cuda_kernels>)
  target_link_libraries(attn PRIVATE CUDA::cudart_static)
  target_compile_definitions(attn PUBLIC ATTN_HAS_CUDA=1)
  message(STATUS "attn: cuda backend ON (architectures ${ATTN_CUDA_ARCHITECTURES})")
else()
  target_sources(attn PRIVATE cuda/stub.cc)
  message(STATUS "attn: cuda backend OFF (no nvcc, or ATTN_CUDA=OFF)")
endif()
