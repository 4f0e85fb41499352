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

# pip install (scikit-build-core): the torch of the Python that installs memgate, and no other, found through that
# Python (whose site-packages scikit-build-core also puts on CMAKE_PREFIX_PATH, so that a search by path would find
# that torch without saying which Python it belongs to).
if(NOT (SKBUILD AND Python_EXECUTABLE))
  find_package(Torch CONFIG QUIET)
endif()
if(NOT Torch_FOUND)
  set(_memgate_pythons "${MEMGATE_PYTHON}" "$ENV{MEMGATE_PYTHON}")
  if(SKBUILD AND Python_EXECUTABLE)
    set(_memgate_pythons "${Python_EXECUTABLE}")
  endif()
  if(NOT SKBUILD)
    if(DEFINED ENV{MEMGATE_VENV})
      list(APPEND _memgate_pythons "$ENV{MEMGATE_VENV}/bin/python")
    endif()
    if(DEFINED ENV{XDG_CACHE_HOME})
      list(APPEND _memgate_pythons "$ENV{XDG_CACHE_HOME}/memgate/venv/bin/python")
    endif()
    list(APPEND _memgate_pythons "$ENV{HOME}/.cache/memgate/venv/bin/python")
    find_program(_memgate_system_python NAMES python3 python)
    list(APPEND _memgate_pythons "${_memgate_system_python}")
  endif()
  # One import of torch (seconds) says all that memgate's build asks of that Python: LibTorch's CMake folder, torch's
  # version and CUDA, its folder, the C++ runtime (libstdc++.so.6) its process has loaded (src/python), and its
  # library folders relative to the environment's data folder (a pip install's memgate-measure, src/cli).
  set(_memgate_torch_probe [=[
import glob, os, sysconfig, torch
print(torch.utils.cmake_prefix_path)
print(torch.__version__)
print(torch.version.cuda or "none")
print(os.path.dirname(torch.__file__))
maps = "/proc/self/maps"
print(next((l.split()[-1] for l in (open(maps).read().splitlines() if os.path.exists(maps) else []) if "/libstdc++.so" in l), "none"))
platlib = sysconfig.get_path("platlib")
libs = [os.path.dirname(torch.__file__) + "/lib"] + sorted({os.path.dirname(p) for p in glob.glob(os.path.dirname(os.path.dirname(torch.__file__)) + "/nvidia/*/lib/libcudart.so.*")})
print(",".join("$ORIGIN/../../" + os.path.relpath(platlib, sysconfig.get_path("data")) + "/" + os.path.relpath(d, platlib) for d in libs))
]=])
  foreach(_py IN LISTS _memgate_pythons)
    if(NOT _py OR NOT EXISTS "${_py}")
      continue()
    endif()
    execute_process(COMMAND "${_py}" -c "${_memgate_torch_probe}"
                    OUTPUT_VARIABLE _torch_info OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc ERROR_QUIET)
    if(_rc EQUAL 0)
      string(REPLACE "\n" ";" _torch_info "${_torch_info}")
      list(GET _torch_info 0 _torch_prefix)
      if(EXISTS "${_torch_prefix}")
        list(GET _torch_info 1 MEMGATE_TORCH_VERSION)
        list(GET _torch_info 2 MEMGATE_TORCH_CUDA)
        list(GET _torch_info 3 _torch_dir)
        list(GET _torch_info 4 _torch_libstdcxx)
        list(GET _torch_info 5 _torch_wheel_rpath)
        string(REPLACE "," ";" _torch_wheel_rpath "${_torch_wheel_rpath}")
        message(STATUS "memgate: LibTorch from ${_py}: ${_torch_prefix}")
        list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
        set(MEMGATE_TORCH_PYTHON "${_py}" CACHE INTERNAL "")
        set(MEMGATE_TORCH_PYTHON_INFO "${MEMGATE_TORCH_VERSION};${_torch_dir};${_torch_libstdcxx}" CACHE INTERNAL
            "torch's version, its folder, the libstdc++ its process loads (none: none found)")
        set(MEMGATE_TORCH_WHEEL_RPATH "${_torch_wheel_rpath}" CACHE INTERNAL
            "torch's library folders, relative to <environment>/libexec/memgate")
        break()
      endif()
    endif()
  endforeach()
  # A CUDA build of torch whose CUDA toolkit is not here: Torch's CMake files would stop configure with an error of
  # their own ("Your installed Caffe2 version uses CUDA but I cannot find the CUDA libraries"); this says it plainly.
  set(MEMGATE_TORCH_CUDA_WITHOUT_TOOLKIT OFF)
  if(MEMGATE_TORCH_PYTHON AND NOT MEMGATE_TORCH_CUDA STREQUAL "none" AND NOT CUDAToolkit_FOUND)
    set(MEMGATE_TORCH_CUDA_WITHOUT_TOOLKIT ON)
  else()
    find_package(Torch CONFIG QUIET)
  endif()
endif()
