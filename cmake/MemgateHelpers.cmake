# Helpers shared by memgate's targets: warnings (and build settings) on an INTERFACE target that every memgate target
# links privately, one function per kind of target.

add_library(memgate_warnings INTERFACE)
add_library(memgate::warnings ALIAS memgate_warnings)
# MEMGATE_WARNINGS=OFF (pip install): a user building memgate to run it sees the build's progress, not its lint.
option(MEMGATE_WARNINGS "Compile with memgate's warnings (-Wall -Wextra ...)" ON)
# MEMGATE_OPTIMIZATION: the optimisation flag of memgate's code, after the build type's: -O0 for pip install, a third
# less to compile. memgate's code builds modules, calls LibTorch's operators (whose kernels, compiled as torch shipped
# them, do the work), reads files and writes reports: the bytes a probe measures are the allocator's and do not depend
# on it (the CPU suite is the same to the byte, and measured in the same time); estimates, which run memgate's Meta
# kernels on every operator, take up to 1.7 times as long (seconds). A target whose loops run over large inputs (the
# caching allocator's model: estimates and replays) sets MEMGATE_KEEP_OPTIMIZATION and keeps the build type's.
set(MEMGATE_OPTIMIZATION "" CACHE STRING
    "Optimisation flag of memgate's code, after the build type's (e.g. -O0; empty: the build type's)")
target_compile_options(memgate_warnings INTERFACE
  $<BUILD_INTERFACE:$<$<NOT:$<BOOL:$<TARGET_PROPERTY:MEMGATE_KEEP_OPTIMIZATION>>>:${MEMGATE_OPTIMIZATION}>>
  $<$<AND:$<BOOL:${MEMGATE_WARNINGS}>,$<CXX_COMPILER_ID:GNU,Clang>>:-Wall -Wextra -Wpedantic -Wshadow
    -Wnon-virtual-dtor -Wcast-align -Woverloaded-virtual -Wnull-dereference -Wno-unused-parameter>
  $<$<BOOL:${MEMGATE_WARNINGS_AS_ERRORS}>:-Werror>
  # Source paths in the binaries (__FILE__ of TORCH_CHECK and assertions) relative to the source tree, so an
  # installed memgate carries no path of the machine it was built on.
  $<BUILD_INTERFACE:$<$<CXX_COMPILER_ID:GNU,Clang>:-ffile-prefix-map=${PROJECT_SOURCE_DIR}/=>>)

# The Python extension links every layer into one shared module, so their code is position-independent; every
# target is compiled alike (-fPIC, through memgate::warnings), so that all of them can reuse one precompiled header.
if(MEMGATE_PYTHON_EXTENSION)
  target_compile_options(memgate_warnings INTERFACE $<$<CXX_COMPILER_ID:GNU,Clang>:-fPIC>)
endif()

# LibTorch's headers are heavy: memgate_models precompiles them once, the other LibTorch targets reuse that. Even so a
# file that includes them costs about 18 s to compile (torch/torch.h's templates instantiated and its inline
# functions generated, in every file: 10 s for a file that is empty but for the precompiled header), so a LibTorch
# target's files are also compiled a few at a time as one (UNITY_BUILD, MEMGATE_UNITY): that cost is paid once per
# batch. A file whose file-local names clash with another's of its target opts out with SKIP_UNITY_BUILD_INCLUSION.
option(MEMGATE_UNITY "Compile a LibTorch target's files in batches (unity builds: much faster builds)" ON)
set(MEMGATE_UNITY_BATCH_SIZE 6 CACHE STRING
    "Files per unity batch of a LibTorch target (0: all of a target's files as one; pip install: 0)")
function(memgate_use_unity target)
  if(MEMGATE_UNITY)
    set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${MEMGATE_UNITY_BATCH_SIZE})
  endif()
endfunction()
function(memgate_use_pch target)
  if(MEMGATE_PCH)
    target_precompile_headers(${target} REUSE_FROM memgate_models)
  endif()
  memgate_use_unity(${target})
endfunction()

# memgate_add_library(<layer> SOURCES <files...> [PUBLIC <deps...>] [PRIVATE <deps...>])
# The library target memgate_<layer> (alias memgate::<layer>) of one folder of src/, its headers under
# include/memgate/<layer>/, warnings on, C++20 a usage requirement.
function(memgate_add_library layer)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  add_library(memgate_${layer} ${ARG_SOURCES})
  add_library(memgate::${layer} ALIAS memgate_${layer})
  target_include_directories(memgate_${layer}
    PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_compile_features(memgate_${layer} PUBLIC cxx_std_20)
  target_link_libraries(memgate_${layer} PUBLIC ${ARG_PUBLIC} PRIVATE ${ARG_PRIVATE} memgate::warnings)
endfunction()

# memgate_add_test(<name> SOURCES <files...> LINK <targets...> LABEL <label> [GPU] [PER_SUITE] [PROCESSORS <n>]
#                  [DEV ALL | DEV <suites...>] [GROUPS <Suite,Suite,...[@shards]>...])
# A unit-test executable linked to the layer it tests and GoogleTest, its tests registered with CTest under one
# label (cpu, or gpu for the CUDA tests: gtest_discover_tests keeps one label per property value). It reuses the
# precompiled LibTorch headers only when it links LibTorch. GPU: each test claims one GPU (CTest resource groups).
# PROCESSORS n: each test claims n cores (tests that start rank processes), so ctest -j does not oversubscribe.
# PER_SUITE: one CTest test per GoogleTest suite instead of one per test (a parameterized suite in up to 4 shards of
# 4 tests or more), for programs that load LibTorch (0.4 s per process before any work: paid once per suite or shard,
# not once per test); a failing test is named in its suite's output (cmake/MemgateTestSuites.cmake).
# DEV: the tests (ALL) or the GoogleTest suites that are labelled dev as well: `ctest --preset dev`.
# GROUPS (with PER_SUITE): suites that run as one CTest test, in one process (cmake/MemgateTestSuites.cmake).
function(memgate_add_test name)
  cmake_parse_arguments(ARG "GPU;PER_SUITE" "LABEL;PROCESSORS" "SOURCES;LINK;DEV;GROUPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/common/test_main.cpp)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/common)
  target_compile_definitions(${name} PRIVATE MEMGATE_TEST_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_link_libraries(${name} PRIVATE ${ARG_LINK} memgate::base GTest::gtest GTest::gmock memgate::warnings)
  if(NOT "${ARG_LINK}" MATCHES "memgate::(base|bench_tools|allocator|report)$")
    memgate_use_pch(${name})
  endif()
  set(gpu_resources "")
  if(ARG_GPU)
    set(gpu_resources RESOURCE_GROUPS gpus:1)
  endif()
  set(processors "")
  if(ARG_PROCESSORS)
    set(processors PROCESSORS ${ARG_PROCESSORS})
  endif()
  if(ARG_PER_SUITE)
    set(properties ${gpu_resources} ${processors})
    list(JOIN properties "|" properties)
    list(JOIN ARG_DEV "|" dev)
    list(JOIN ARG_GROUPS "|" groups)
    set(suites "${CMAKE_CURRENT_BINARY_DIR}/${name}_suites.cmake")
    # Listed again whenever the program or the script changes.
    add_custom_command(OUTPUT "${suites}"
      COMMAND "${CMAKE_COMMAND}" "-DPROGRAM=$<TARGET_FILE:${name}>" "-DOUTPUT=${suites}" "-DLABELS=${ARG_LABEL}"
              "-DDEV=${dev}" "-DGROUPS=${groups}"
              "-DENVIRONMENT=MEMGATE_SOURCE_DIR=${PROJECT_SOURCE_DIR}" "-DPROPERTIES=${properties}"
              -P "${PROJECT_SOURCE_DIR}/cmake/MemgateTestSuites.cmake"
      DEPENDS ${name} "${PROJECT_SOURCE_DIR}/cmake/MemgateTestSuites.cmake"
      COMMENT "Listing the test suites of ${name}"
      VERBATIM)
    add_custom_target(${name}_suites ALL DEPENDS "${suites}")
    set(include "${CMAKE_CURRENT_BINARY_DIR}/${name}_include.cmake")
    file(WRITE "${include}"
      "if(EXISTS [==[${suites}]==])\n  include([==[${suites}]==])\nelse()\n"
      "  add_test([==[${name}_NOT_BUILT]==] [==[${name}_NOT_BUILT]==])\n"
      "  set_tests_properties([==[${name}_NOT_BUILT]==] PROPERTIES LABELS [==[${ARG_LABEL}]==])\nendif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include}")
    return()
  endif()
  include(GoogleTest)
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS "${ARG_LABEL}" ENVIRONMENT "MEMGATE_SOURCE_DIR=${PROJECT_SOURCE_DIR}" ${gpu_resources}
               ${processors})
  if(ARG_DEV)
    # The tests are known only as CTest runs (PRE_TEST), in ${name}_TESTS: labelled dev after they are added (a list
    # of labels does not survive gtest_discover_tests's PROPERTIES), all of them or those of the suites DEV names.
    list(JOIN ARG_DEV "|" suites)
    set(dev "${CMAKE_CURRENT_BINARY_DIR}/${name}_dev.cmake")
    file(WRITE "${dev}" "foreach(test IN LISTS ${name}_TESTS)\n"
                        "  if([==[${suites}]==] STREQUAL \"ALL\" OR test MATCHES [==[^(${suites})\\.]==])\n"
                        "    set_tests_properties(\${test} PROPERTIES LABELS [==[${ARG_LABEL};dev]==])\n"
                        "  endif()\nendforeach()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${dev}")
  endif()
endfunction()

# memgate_add_bench(<name> SOURCES <files...>)
function(memgate_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE memgate::core benchmark::benchmark memgate::warnings)
  memgate_use_pch(${name})
endfunction()

# memgate_add_memory_suite(TARGET <name> ...): the memory regression suites, memgate's and a downstream project's.
include(MemgateMemorySuite)
