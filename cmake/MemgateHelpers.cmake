# Helpers shared by memgate's targets: warnings on an INTERFACE target, one function per kind of target.

add_library(memgate_warnings INTERFACE)
add_library(memgate::warnings ALIAS memgate_warnings)
target_compile_options(memgate_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wcast-align
    -Woverloaded-virtual -Wnull-dereference -Wno-unused-parameter>
  $<$<BOOL:${MEMGATE_WARNINGS_AS_ERRORS}>:-Werror>)

# LibTorch's headers are heavy: every target precompiles them once, or reuses memgate_core's.
function(memgate_use_pch target)
  if(MEMGATE_PCH)
    target_precompile_headers(${target} REUSE_FROM memgate_core)
  endif()
endfunction()

# memgate_add_test(<name> SOURCES <files...> [LABELS <labels...>])
# A unit-test executable linked to memgate::core and GoogleTest, its tests registered with CTest.
function(memgate_add_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE memgate::core GTest::gtest GTest::gmock memgate::warnings)
  memgate_use_pch(${name})
  include(GoogleTest)
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    PROPERTIES LABELS "${ARG_LABELS}" ENVIRONMENT "MEMGATE_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
endfunction()

# memgate_add_bench(<name> SOURCES <files...>)
function(memgate_add_bench name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE memgate::core benchmark::benchmark memgate::warnings)
  memgate_use_pch(${name})
endfunction()
