# memgate_add_memory_suite: memgate's memory regression tests for a project's own fixtures, suites and baselines.
# Included by memgate's own build and by memgateConfig.cmake (find_package(memgate) or FetchContent), so that a
# downstream project gets the very tests memgate runs on its zoo.
#
#   memgate_add_memory_suite(TARGET <name>
#     [SOURCES <files...>]      # the project's code: models it registers (memgate/models/registry.h)
#     [LINK <targets...>]       # libraries those sources need
#     [PROJECT_DIR <dir>]       # holds fixtures/models, fixtures/suites (default: the calling CMakeLists' folder)
#     [SUITES <files...>]       # suite files (default: every <PROJECT_DIR>/fixtures/suites/*.yaml)
#     [BASELINES <dir>])        # baselines/<device>/<fixture>.json (default: <PROJECT_DIR>/baselines)
#
# It builds the executable <name> (memgate::memory_suite's tests and main(), with SOURCES) and registers its tests
# with CTest when ctest runs (so a new fixture needs no reconfigure):
# - measuring tests (label `measure`, FIXTURES_SETUP): one per CPU suite (Cpu/MeasureTest.Probes/<suite>_suite),
#   one per GPU-suite fixture (each claiming one GPU through RESOURCE_GROUPS); each measures every probe once and
#   leaves its verdicts in <build>/memgate-verdicts;
# - one component test per fixture x batch size x component (Cpu/ComponentTest.StaysWithinBaseline/<fixture>_bs8_
#   activations; labels cpu|gpu, memory, the fixture, the component), run by memgate-verdicts (no LibTorch);
# - Gpu/BudgetTest.* for the budgets of GPU suites.
# Update the baselines with the target <name>_update_baselines (or: MEMGATE_UPDATE_BASELINES=1 ctest -L '^measure$').

# The script ctest runs to register the tests, beside this file (in the source tree and where it is installed).
set_property(GLOBAL PROPERTY MEMGATE_LIST_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/MemgateListMemoryTests.cmake")

function(memgate_add_memory_suite)
  cmake_parse_arguments(ARG "" "TARGET;PROJECT_DIR;BASELINES" "SOURCES;LINK;SUITES" ${ARGN})
  if(NOT ARG_TARGET)
    message(FATAL_ERROR "memgate_add_memory_suite: TARGET <name> is required")
  endif()
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "memgate_add_memory_suite: unknown arguments: ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_PROJECT_DIR)
    set(ARG_PROJECT_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  endif()
  get_filename_component(project_dir "${ARG_PROJECT_DIR}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  set(suites "")
  foreach(suite IN LISTS ARG_SUITES)
    get_filename_component(suite "${suite}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
    if(NOT EXISTS "${suite}")
      message(FATAL_ERROR "memgate_add_memory_suite(${ARG_TARGET}): SUITES: ${suite} does not exist")
    endif()
    list(APPEND suites "${suite}")
  endforeach()
  list(JOIN suites ":" suites)
  if(ARG_BASELINES)
    get_filename_component(baselines "${ARG_BASELINES}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  else()
    set(baselines "${project_dir}/baselines")
  endif()
  get_property(data_dir GLOBAL PROPERTY MEMGATE_DATA_DIR)
  get_property(list_script GLOBAL PROPERTY MEMGATE_LIST_SCRIPT)

  # main() comes from memgate::memory_suite; an executable needs a source of its own.
  set(anchor "${CMAKE_CURRENT_BINARY_DIR}/${ARG_TARGET}_anchor.cpp")
  file(CONFIGURE OUTPUT "${anchor}" CONTENT "// ${ARG_TARGET}: main() and the tests come from memgate::memory_suite.\n")
  add_executable(${ARG_TARGET} "${anchor}" ${ARG_SOURCES})
  target_link_libraries(${ARG_TARGET} PRIVATE memgate::memory_suite ${ARG_LINK})

  set(environment "MEMGATE_PROJECT_DIR=${project_dir}" "MEMGATE_BASELINES_DIR=${baselines}"
                  "MEMGATE_DATA_DIR=${data_dir}" "MEMGATE_SUITES=${suites}")
  set(verdicts "${CMAKE_CURRENT_BINARY_DIR}/memgate-verdicts")
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${ARG_TARGET}_include.cmake")
  set(list_file "${CMAKE_CURRENT_BINARY_DIR}/${ARG_TARGET}_tests.cmake")
  # Registered as ctest starts, by MemgateListMemoryTests.cmake (which keeps the listing while what it read is
  # unchanged).
  file(GENERATE OUTPUT "${include_file}" CONTENT
"set(memgate_list_target [==[${ARG_TARGET}]==])
set(memgate_list_cmake [==[${CMAKE_COMMAND}]==])
set(memgate_list_program [==[$<TARGET_FILE:${ARG_TARGET}>]==])
set(memgate_list_verdict_program [==[$<TARGET_FILE:memgate::verdicts>]==])
set(memgate_list_environment [==[${environment}]==])
set(memgate_list_verdicts [==[${verdicts}]==])
set(memgate_list_file [==[${list_file}]==])
set(memgate_list_caller [==[${include_file}]==])
include([==[${list_script}]==])
")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${include_file}")

  add_custom_target(${ARG_TARGET}_update_baselines
    COMMAND "${CMAKE_COMMAND}" -E env MEMGATE_UPDATE_BASELINES=1
            "${CMAKE_CTEST_COMMAND}" --test-dir "${CMAKE_BINARY_DIR}" -L "^measure$" --output-on-failure
    DEPENDS ${ARG_TARGET}
    COMMENT "Recording the baselines of ${ARG_TARGET}'s suites in ${baselines}"
    USES_TERMINAL VERBATIM)
endfunction()
