# Finds every dependency of memgate, in one place. What is missing stops configure with one message that names each
# missing prerequisite and the one command that installs them all.

# memgate_missing(<what> [DEBIAN <packages...>] [HOW <line>]): a prerequisite that was not found: its Debian/Ubuntu
# packages, or the line that installs it otherwise. memgate_stop_if_missing() says them all at once.
function(memgate_missing what)
  cmake_parse_arguments(ARG "" "HOW" "DEBIAN" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY MEMGATE_MISSING "${what}")
  set_property(GLOBAL APPEND PROPERTY MEMGATE_MISSING_DEBIAN ${ARG_DEBIAN})
  if(ARG_HOW)
    set_property(GLOBAL APPEND PROPERTY MEMGATE_MISSING_HOW "${ARG_HOW}")
  endif()
endfunction()

function(memgate_stop_if_missing)
  get_property(missing GLOBAL PROPERTY MEMGATE_MISSING)
  if(NOT missing)
    return()
  endif()
  get_property(debian GLOBAL PROPERTY MEMGATE_MISSING_DEBIAN)
  get_property(how GLOBAL PROPERTY MEMGATE_MISSING_HOW)
  list(JOIN missing "\n  - " missing)
  set(text "memgate: missing prerequisites:\n  - ${missing}\n")
  if(debian)
    list(REMOVE_DUPLICATES debian)
    list(JOIN debian " " debian)
    string(APPEND text "Install them (Debian, Ubuntu):\n  sudo apt-get install ${debian}\n")
  endif()
  foreach(line IN LISTS how)
    string(APPEND text "${line}\n")
  endforeach()
  string(APPEND text "Every prerequisite, for each system: README.md, 'Install'. In a clone of memgate, ci/setup.sh "
                     "installs them all (Debian).")
  message(FATAL_ERROR "${text}")
endfunction()

# --- Debian -dev packages -------------------------------------------------------------------------------------
find_package(yaml-cpp CONFIG QUIET)
if(NOT yaml-cpp_FOUND)
  memgate_missing("yaml-cpp" DEBIAN libyaml-cpp-dev)
endif()
find_package(nlohmann_json 3.10 CONFIG QUIET)
if(NOT nlohmann_json_FOUND)
  memgate_missing("nlohmann/json (>= 3.10)" DEBIAN nlohmann-json3-dev)
endif()
find_package(fmt CONFIG QUIET)
if(NOT fmt_FOUND)
  memgate_missing("fmt" DEBIAN libfmt-dev)
endif()
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  memgate_missing("CLI11" DEBIAN libcli11-dev)
endif()
# GoogleTest: the memory suites are GoogleTests (memgate::memory_suite), so memgate needs it wherever it builds them
# (its tests, an install for find_package(memgate), FetchContent); pip install does not.
if(MEMGATE_MEMORY_SUITE OR MEMGATE_BUILD_TESTS)
  find_package(GTest CONFIG QUIET)
  if(NOT GTest_FOUND)
    memgate_missing("GoogleTest" DEBIAN libgtest-dev libgmock-dev)
  endif()
endif()
# gloo's headers: LibTorch ships ProcessGroupGloo (its gloo is linked into libtorch_cpu) but not the gloo headers
# ProcessGroupGloo.hpp includes. Debian's are of another gloo commit; they only declare the types ProcessGroupGloo
# holds behind pointers, so the wheel's own layout and code are what run (tests/distributed proves it with real
# collectives). Nothing links Debian's libgloo.
find_path(MEMGATE_GLOO_INCLUDE_DIR gloo/config.h)
if(NOT MEMGATE_GLOO_INCLUDE_DIR)
  memgate_missing("gloo's headers (for LibTorch's ProcessGroupGloo)" DEBIAN libgloo-dev)
endif()
if(MEMGATE_BUILD_BENCHMARKS)
  find_package(benchmark CONFIG QUIET)
  if(NOT benchmark_FOUND)
    memgate_missing("Google Benchmark" DEBIAN libbenchmark-dev)
  endif()
endif()

# --- LibTorch ------------------------------------------------------------------------------------------------
include(MemgateFindTorch)
if(NOT Torch_FOUND)
  if(MEMGATE_TORCH_CUDA_WITHOUT_TOOLKIT)
    # A CUDA build of torch (PyPI's on Linux): Torch's CMake files need the CUDA toolkit it was built with.
    memgate_missing("the CUDA ${MEMGATE_TORCH_CUDA} toolkit (nvcc, headers), which the CMake files of torch "
                    "${MEMGATE_TORCH_VERSION} need: it is a CUDA ${MEMGATE_TORCH_CUDA} build (${MEMGATE_TORCH_PYTHON})"
      HOW "The CUDA ${MEMGATE_TORCH_CUDA} toolkit: NVIDIA's package repository (cuda-toolkit-<major>-<minor>), "
          "then set CUDAToolkit_ROOT (or CUDA_HOME) to it if it is not /usr/local/cuda; or build against a CPU-only "
          "torch.")
  elseif(SKBUILD)
    # pip install: memgate is built against the torch of the Python that installs it, and no other.
    memgate_missing("torch in ${Python_EXECUTABLE}, the Python pip runs in (memgate builds against its torch)"
      HOW "torch: ${Python_EXECUTABLE} -m pip install torch==2.11.0   (then pip install memgate again)")
  else()
    memgate_missing("LibTorch (torch 2.11.0)"
      HOW "LibTorch: set Torch_DIR to <libtorch>/share/cmake/Torch, or MEMGATE_PYTHON to a Python that has "
          "torch==2.11.0 (python3 -m pip install torch==2.11.0).")
  endif()
endif()

# --- Python's headers, for memgate's extension (the Python whose torch LibTorch is) --------------------------------
if(MEMGATE_PYTHON_EXTENSION AND MEMGATE_TORCH_PYTHON)
  set(Python3_EXECUTABLE "${MEMGATE_TORCH_PYTHON}")
  find_package(Python3 QUIET COMPONENTS Interpreter Development.Module)
  if(NOT Python3_Development.Module_FOUND)
    memgate_missing("the headers of Python ${Python3_VERSION} (${MEMGATE_TORCH_PYTHON}), for memgate's extension"
      DEBIAN python3-dev)
  endif()
endif()

memgate_stop_if_missing()

message(STATUS "memgate: Torch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")
set(MEMGATE_HAS_CUDA OFF)
if(TARGET torch_cuda OR TARGET c10_cuda OR "${TORCH_LIBRARIES}" MATCHES "c10_cuda")
  set(MEMGATE_HAS_CUDA ON)
endif()

# LibTorch ships headers of another fmt (12.x) in its include folder, searched before /usr/include: a target that
# sees both would compile against those and link Debian's libfmt. memgate::fmt puts Debian's headers first (a
# folder holding only a link to them, given with -I, which GCC searches before LibTorch's -isystem folders).
find_path(MEMGATE_FMT_INCLUDE_DIR fmt/format.h HINTS ${fmt_DIR}/../../../../include REQUIRED)
set(_memgate_fmt_first "${PROJECT_BINARY_DIR}/memgate-fmt-first")
file(MAKE_DIRECTORY "${_memgate_fmt_first}")
file(CREATE_LINK "${MEMGATE_FMT_INCLUDE_DIR}/fmt" "${_memgate_fmt_first}/fmt" SYMBOLIC)
add_library(memgate_fmt INTERFACE)
add_library(memgate::fmt ALIAS memgate_fmt)
target_include_directories(memgate_fmt INTERFACE "$<BUILD_INTERFACE:${_memgate_fmt_first}>")
target_link_libraries(memgate_fmt INTERFACE fmt::fmt)
add_library(memgate_c10d_gloo INTERFACE)
add_library(memgate::c10d_gloo ALIAS memgate_c10d_gloo)
target_include_directories(memgate_c10d_gloo SYSTEM INTERFACE "$<BUILD_INTERFACE:${MEMGATE_GLOO_INCLUDE_DIR}>")
target_compile_definitions(memgate_c10d_gloo INTERFACE USE_C10D_GLOO)
# NCCL's header, for LibTorch's ProcessGroupNCCL (ranks on GPUs). Its layout follows the NCCL version in nccl.h, so
# the header is the one of the wheel's own NCCL (site-packages/nvidia/nccl, beside torch) before any other; the rank
# checks at run time that LibTorch runs the same major.minor. Without a CUDA LibTorch or nccl.h, ranks run on the CPU
# only (a distributed probe on CUDA says why not).
set(MEMGATE_HAS_NCCL OFF)
if(MEMGATE_HAS_CUDA)
  find_path(MEMGATE_NCCL_INCLUDE_DIR nccl.h
    HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS}
    NO_CACHE)
  if(MEMGATE_NCCL_INCLUDE_DIR)
    set(MEMGATE_HAS_NCCL ON)
    message(STATUS "memgate: NCCL ranks on GPUs, nccl.h from ${MEMGATE_NCCL_INCLUDE_DIR}")
  else()
    message(STATUS "memgate: no nccl.h (pip install nvidia-nccl-cu13, or the CUDA toolkit's): ranks run on the CPU only")
  endif()
endif()

# cuDNN's backend header (cudnn_graph.h), for estimates for CUDA that ask cuDNN, without a GPU, the workspace each
# convolution takes: the header of the wheel's own cuDNN (site-packages/nvidia/cudnn, beside torch), which memgate
# loads at run time (libcudnn_graph.so.9, dlopen: nothing is linked), and CUDA's runtime headers it includes (the
# wheel's nvidia/cu13, else the toolkit's). Without them an estimate for CUDA that reaches a cuDNN convolution fails,
# saying so.
set(MEMGATE_HAS_CUDNN_HEADERS OFF)
find_path(MEMGATE_CUDNN_INCLUDE_DIR cudnn_graph.h
  HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/cudnn/include" "${TORCH_INSTALL_PREFIX}/include" ${CUDAToolkit_INCLUDE_DIRS}
  NO_CACHE)
find_path(MEMGATE_CUDA_RUNTIME_INCLUDE_DIR cuda_runtime_api.h
  HINTS "${TORCH_INSTALL_PREFIX}/../nvidia/cu13/include" ${CUDAToolkit_INCLUDE_DIRS}
  NO_CACHE)
if(MEMGATE_CUDNN_INCLUDE_DIR AND MEMGATE_CUDA_RUNTIME_INCLUDE_DIR)
  set(MEMGATE_HAS_CUDNN_HEADERS ON)
  message(STATUS "memgate: cuDNN's workspaces in estimates for CUDA, cudnn_graph.h from ${MEMGATE_CUDNN_INCLUDE_DIR}")
else()
  message(STATUS "memgate: no cudnn_graph.h (pip install nvidia-cudnn-cu13): estimates for CUDA cannot size cuDNN's workspaces")
endif()

# Added to another project (FetchContent, add_subdirectory), memgate's targets are linked from that project's
# folders: the imported targets they name (torch, yaml-cpp, GTest, ...) must be visible there too.
if(NOT PROJECT_IS_TOP_LEVEL)
  get_property(_memgate_imported DIRECTORY PROPERTY IMPORTED_TARGETS)
  foreach(_target IN LISTS _memgate_imported)
    get_target_property(_global ${_target} IMPORTED_GLOBAL)
    if(NOT _global)
      set_target_properties(${_target} PROPERTIES IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()
if(NOT TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
endif()
