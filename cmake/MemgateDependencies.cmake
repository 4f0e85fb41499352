# Finds every dependency of memgate, in one place. A missing one stops configure with one message that says
# which and how to get it.

# Stops configure naming the missing dependency and the command that installs it.
function(memgate_missing what how)
  message(FATAL_ERROR
    "memgate: ${what} was not found.\n"
    "  ${how}\n"
    "  On a fresh machine `ci/setup.sh` installs every dependency of memgate.")
endfunction()

# --- LibTorch ------------------------------------------------------------------------------------------------
include(MemgateFindTorch)
if(NOT Torch_FOUND)
  memgate_missing("LibTorch (torch 2.11.0)"
    "Set Torch_DIR to <libtorch>/share/cmake/Torch, or MEMGATE_PYTHON to a Python that has torch==2.11.0, or run ci/setup.sh (it installs torch into ~/.cache/memgate/venv).")
endif()
message(STATUS "memgate: Torch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")
set(MEMGATE_HAS_CUDA OFF)
if(TARGET torch_cuda OR TARGET c10_cuda OR "${TORCH_LIBRARIES}" MATCHES "c10_cuda")
  set(MEMGATE_HAS_CUDA ON)
endif()

# --- Debian -dev packages -------------------------------------------------------------------------------------
find_package(yaml-cpp CONFIG QUIET)
if(NOT yaml-cpp_FOUND)
  memgate_missing("yaml-cpp" "Install it: apt-get install libyaml-cpp-dev")
endif()
find_package(nlohmann_json 3.10 CONFIG QUIET)
if(NOT nlohmann_json_FOUND)
  memgate_missing("nlohmann/json (>= 3.10)" "Install it: apt-get install nlohmann-json3-dev")
endif()
find_package(fmt CONFIG QUIET)
if(NOT fmt_FOUND)
  memgate_missing("fmt" "Install it: apt-get install libfmt-dev")
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
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  memgate_missing("CLI11" "Install it: apt-get install libcli11-dev")
endif()
# GoogleTest: the memory suites are GoogleTests (memgate::memory_suite), so memgate needs it, tests built or not.
find_package(GTest CONFIG QUIET)
if(NOT GTest_FOUND)
  memgate_missing("GoogleTest" "Install it: apt-get install libgtest-dev libgmock-dev")
endif()
# gloo's headers: LibTorch ships ProcessGroupGloo (its gloo is linked into libtorch_cpu) but not the gloo headers
# ProcessGroupGloo.hpp includes. Debian's are of another gloo commit; they only declare the types ProcessGroupGloo
# holds behind pointers, so the wheel's own layout and code are what run (tests/distributed proves it with real
# collectives). Nothing links Debian's libgloo.
find_path(MEMGATE_GLOO_INCLUDE_DIR gloo/config.h)
if(NOT MEMGATE_GLOO_INCLUDE_DIR)
  memgate_missing("gloo's headers (for LibTorch's ProcessGroupGloo)" "Install them: apt-get install libgloo-dev")
endif()
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
if(MEMGATE_BUILD_BENCHMARKS)
  find_package(benchmark CONFIG QUIET)
  if(NOT benchmark_FOUND)
    memgate_missing("Google Benchmark" "Install it: apt-get install libbenchmark-dev")
  endif()
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
