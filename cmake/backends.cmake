# Backends: the code that differs with the GPU a binary drives. The device layer's
# implementation, the op dispatch (kernels/dispatch.cpp), the GPU kernels and the GPU collectives
# are compiled once per backend into an object library, which the executables of that backend link
# directly; every other module is compiled once per build, whatever backends the build holds. So a
# CPU build's tests link the same modules to the emulated GPU (tests/CMakeLists.txt) and, where
# nvcc is here, to the CUDA backend, without building the tree again for each.
#   none      device_none.cpp: GPU queries answer none (the CPU build's anvil)
#   cuda      nvcc, cuBLASLt, NCCL
#   hip       hipcc, hipBLASLt, RCCL
#   emulated  the GPU sources compiled as C++ against the emulated runtime and BLAS
#             (device/emulated/), 32-lane warps or AMD's 64-lane wavefronts: tests only
set(anvil_gpu_kernel_sources gpu/ops.cu gpu/moe.cu gpu/optimizer.cu gpu/fixed_point.cu gpu/flash_attention.cu
                             gpu/matmul.cpp gpu/attention.cpp)
list(TRANSFORM anvil_gpu_kernel_sources PREPEND ${PROJECT_SOURCE_DIR}/src/kernels/)

# anvil_backend(NAME SOURCES... [DEFINITIONS defs...] [LIBS libs...] [LANGUAGE lang]): the object
# library anvil_backend_NAME, defined in the calling directory (whose source-file properties its
# sources take: LANGUAGE compiles the GPU kernel sources as that language).
function(anvil_backend name)
  cmake_parse_arguments(B "" "LANGUAGE" "SOURCES;DEFINITIONS;LIBS" ${ARGN})
  set(target anvil_backend_${name})
  add_library(${target} OBJECT ${PROJECT_SOURCE_DIR}/src/kernels/dispatch.cpp ${B_SOURCES})
  # Each GPU source has its own file-local constants and helpers: never joined in a unity build.
  set_target_properties(${target} PROPERTIES UNITY_BUILD OFF)
  if(B_LANGUAGE)
    set_source_files_properties(${anvil_gpu_kernel_sources} PROPERTIES LANGUAGE ${B_LANGUAGE})
  endif()
  target_compile_definitions(${target} PUBLIC ${B_DEFINITIONS})
  # The kernels' own flags (src/kernels/CMakeLists.txt says why); nvcc without fast math.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-fno-trapping-math -fno-math-errno>
                                           $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  if(ANVIL_OPTIMIZE)
    target_compile_options(${target} PRIVATE -O3)
  endif()
  target_link_libraries(${target} PUBLIC anvil_parallel anvil_kernels anvil_device anvil_core ${B_LIBS})
endfunction()

set(anvil_gpu_backend_sources ${PROJECT_SOURCE_DIR}/src/device/device.cpp ${anvil_gpu_kernel_sources}
                              ${PROJECT_SOURCE_DIR}/src/parallel/gpu_collectives_nccl.cpp)
if(ANVIL_BACKEND STREQUAL "none")
  anvil_backend(none SOURCES ${PROJECT_SOURCE_DIR}/src/device/device_none.cpp
                             ${PROJECT_SOURCE_DIR}/src/parallel/gpu_collectives_none.cpp)
endif()
if(TARGET CUDA::cudart_static)
  find_library(ANVIL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} REQUIRED)
  find_path(ANVIL_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  anvil_backend(cuda SOURCES ${anvil_gpu_backend_sources} DEFINITIONS ANVIL_GPU
                LIBS CUDA::cudart_static CUDA::cublasLt ${ANVIL_NCCL_LIBRARY})
  target_include_directories(anvil_backend_cuda PRIVATE ${ANVIL_NCCL_INCLUDE})
endif()
if(ANVIL_BACKEND STREQUAL "hip")
  find_package(rccl REQUIRED)
  set_source_files_properties(${PROJECT_SOURCE_DIR}/src/device/device.cpp PROPERTIES LANGUAGE HIP)
  anvil_backend(hip SOURCES ${anvil_gpu_backend_sources} DEFINITIONS ANVIL_GPU ANVIL_HIP LANGUAGE HIP
                LIBS hip::host roc::hipblaslt rccl::rccl)
endif()

# The emulated GPU, for the tests of a CPU build; WARP 64 adds ANVIL_HIP (AMD's wavefronts).
function(anvil_emulated_backend name warp)
  set(defs ANVIL_GPU ANVIL_GPU_EMULATION)
  if(warp EQUAL 64)
    list(APPEND defs ANVIL_HIP)
  endif()
  anvil_backend(${name} LANGUAGE CXX DEFINITIONS ${defs} LIBS PkgConfig::OPENBLAS
                SOURCES ${PROJECT_SOURCE_DIR}/src/device/device.cpp ${anvil_gpu_kernel_sources}
                        ${PROJECT_SOURCE_DIR}/src/device/emulated/emulation.cpp
                        ${PROJECT_SOURCE_DIR}/src/device/emulated/blas_emulation.cpp
                        ${PROJECT_SOURCE_DIR}/src/parallel/gpu_collectives_none.cpp)
endfunction()
