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
# Order: Torch_DIR / CMAKE_PREFIX_PATH (an unzipped libtorch), then a Python that has torch: MEMGATE_PYTHON,
# the virtual environment ci/setup.sh makes, python3 on PATH.
set(MEMGATE_PYTHON "" CACHE FILEPATH "A Python whose torch provides LibTorch (used when Torch_DIR is not set)")

# Torch's CMake files for CUDA builds of some versions ask for CUDA::nvToolsExt, which CUDA 12.9+ no longer
# ships; NVTX 3 is header-only, so stand it in for the old library.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND AND NOT TARGET CUDA::nvToolsExt AND TARGET CUDA::nvtx3)
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
endif()

# memgate compiles no CUDA kernels: naming the architectures skips Torch's GPU detection (a try_run that fails
# on machines without a GPU and under C++20).
if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0" CACHE STRING "CUDA architectures for Torch's CMake files")
endif()

find_package(Torch CONFIG QUIET)
if(NOT Torch_FOUND)
  set(_memgate_pythons "${MEMGATE_PYTHON}" "$ENV{MEMGATE_PYTHON}")
  if(DEFINED ENV{MEMGATE_VENV})
    list(APPEND _memgate_pythons "$ENV{MEMGATE_VENV}/bin/python")
  endif()
  if(DEFINED ENV{XDG_CACHE_HOME})
    list(APPEND _memgate_pythons "$ENV{XDG_CACHE_HOME}/memgate/venv/bin/python")
  endif()
  list(APPEND _memgate_pythons "$ENV{HOME}/.cache/memgate/venv/bin/python")
  find_program(_memgate_system_python NAMES python3 python)
  list(APPEND _memgate_pythons "${_memgate_system_python}")
  foreach(_py IN LISTS _memgate_pythons)
    if(NOT _py OR NOT EXISTS "${_py}")
      continue()
    endif()
    execute_process(
      COMMAND "${_py}" -c "import torch; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
      RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0 AND EXISTS "${_torch_prefix}")
      message(STATUS "memgate: LibTorch from ${_py}: ${_torch_prefix}")
      list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
      set(MEMGATE_TORCH_PYTHON "${_py}" CACHE INTERNAL "")
      break()
    endif()
  endforeach()
  find_package(Torch CONFIG QUIET)
endif()
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
if(NOT TARGET yaml-cpp::yaml-cpp)
  add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
endif()
find_package(nlohmann_json 3.10 CONFIG QUIET)
if(NOT nlohmann_json_FOUND)
  memgate_missing("nlohmann/json (>= 3.10)" "Install it: apt-get install nlohmann-json3-dev")
endif()
# memgate links fmt::fmt-header-only: LibTorch's include folder carries fmt headers of its own (fmt 12 in torch
# 2.11), and they come before the system's in every target that links LibTorch. Header-only, each object file holds
# the fmt its headers are, and no libfmt of another version has to match them at link time.
find_package(fmt CONFIG QUIET)
if(NOT fmt_FOUND)
  memgate_missing("fmt" "Install it: apt-get install libfmt-dev")
endif()
find_package(CLI11 CONFIG QUIET)
if(NOT CLI11_FOUND)
  memgate_missing("CLI11" "Install it: apt-get install libcli11-dev")
endif()
if(MEMGATE_BUILD_TESTS)
  find_package(GTest CONFIG QUIET)
  if(NOT GTest_FOUND)
    memgate_missing("GoogleTest" "Install it: apt-get install libgtest-dev libgmock-dev")
  endif()
endif()
if(MEMGATE_BUILD_BENCHMARKS)
  find_package(benchmark CONFIG QUIET)
  if(NOT benchmark_FOUND)
    memgate_missing("Google Benchmark" "Install it: apt-get install libbenchmark-dev")
  endif()
endif()
