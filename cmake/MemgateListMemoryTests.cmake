# Run by ctest as it starts (a TEST_INCLUDE_FILES script that memgate_add_memory_suite generates, with the variables
# below set): registers the memory suite's tests, as the suite program lists them (--memgate_ctest_list).
#   memgate_list_target       the suite program's target name (names the test that fails when the listing does)
#   memgate_list_cmake        cmake (ctest runs this script without CMAKE_COMMAND)
#   memgate_list_program      the suite program; memgate_list_verdict_program: memgate-verdicts
#   memgate_list_environment  VAR=value ... the listing runs with (the project's folders and suites)
#   memgate_list_verdicts     where the measuring tests leave their verdicts
#   memgate_list_file         where the listing goes (<list>.inputs beside it)
#   memgate_list_caller       the generated script that sets these
#
# Listing loads LibTorch and, on a GPU runner, CUDA: a third of a second here, more there, at every ctest. So the
# listing is kept with what it read (<list>.inputs, written by the program: the suite files, their fixtures, the GPUs'
# files and the folders they are in; its first line the GPUs this machine shows) and reused while the GPUs are the
# same and none of those files, the programs and these scripts is newer than it (a folder is newer once a file in it is
# added, removed or renamed). A listing that failed is not kept: each ctest lists again and says why.
set(memgate_list_inputs "${memgate_list_file}.inputs")
file(GLOB memgate_list_gpus /dev/nvidia[0-9]*)
string(REPLACE ";" "," memgate_list_key "gpus=${memgate_list_gpus} CUDA_VISIBLE_DEVICES=$ENV{CUDA_VISIBLE_DEVICES}")

set(memgate_list_fresh FALSE)
if(EXISTS "${memgate_list_inputs}" AND EXISTS "${memgate_list_file}")
  file(STRINGS "${memgate_list_inputs}" memgate_list_read)
  list(POP_FRONT memgate_list_read memgate_list_for)
  if(memgate_list_for STREQUAL memgate_list_key)
    set(memgate_list_fresh TRUE)
    foreach(memgate_list_input IN LISTS memgate_list_read
                                ITEMS "${memgate_list_program}" "${memgate_list_verdict_program}"
                                      "${memgate_list_caller}" "${CMAKE_CURRENT_LIST_FILE}")
      if(NOT EXISTS "${memgate_list_input}" OR "${memgate_list_input}" IS_NEWER_THAN "${memgate_list_file}")
        set(memgate_list_fresh FALSE)
        break()
      endif()
    endforeach()
  endif()
endif()
if(memgate_list_fresh)
  include("${memgate_list_file}")
  return()
endif()

file(REMOVE "${memgate_list_inputs}")
execute_process(COMMAND "${memgate_list_cmake}" -E env ${memgate_list_environment}
    "${memgate_list_program}" --memgate_ctest_list
    "--memgate_verdict_binary=${memgate_list_verdict_program}"
    "--memgate_verdicts_dir=${memgate_list_verdicts}"
    "--memgate_ctest_inputs=${memgate_list_inputs}.read"  # replaced, or removed where the listing is not to be kept
  OUTPUT_FILE "${memgate_list_file}" ERROR_VARIABLE memgate_list_error RESULT_VARIABLE memgate_list_rc)
if(memgate_list_rc EQUAL 0)
  if(EXISTS "${memgate_list_inputs}.read")
    file(READ "${memgate_list_inputs}.read" memgate_list_read)
    file(WRITE "${memgate_list_inputs}" "${memgate_list_key}\n${memgate_list_read}")
    file(REMOVE "${memgate_list_inputs}.read")
  endif()
  include("${memgate_list_file}")
else()
  string(REPLACE "\n" " " memgate_list_error "${memgate_list_error}")
  add_test(${memgate_list_target}_cannot_list_suites "${memgate_list_cmake}" -E echo
           "memgate: listing the memory suites failed: ${memgate_list_error}")
  set_tests_properties(${memgate_list_target}_cannot_list_suites PROPERTIES LABELS "cpu;gpu;memory;measure"
                       WILL_FAIL TRUE)
endif()
