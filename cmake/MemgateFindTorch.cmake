# Finds LibTorch for memgate and for projects that use an installed memgate (memgateConfig.cmake includes it):
# Torch_DIR / CMAKE_PREFIX_PATH (an unzipped libtorch) first, then a Python that has torch: MEMGATE_PYTHON, the
# virtual environment ci/setup.sh makes, python3 on PATH. Sets Torch_FOUND, TORCH_LIBRARIES and the `torch` target.
if(Torch_FOUND)
  return()
endif()
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
  # pip install (scikit-build-core): the Python that installs memgate, whose torch it is built against.
  if(SKBUILD AND Python_EXECUTABLE)
    list(PREPEND _memgate_pythons "${Python_EXECUTABLE}")
  endif()
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
