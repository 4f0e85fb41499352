# Run after a test program is built (memgate_add_test ... PER_SUITE): lists its GoogleTest suites and writes one CTest
# test per suite (--gtest_filter=<suite>.*), so that a program that loads LibTorch (0.4 s before any work) pays for it
# once per suite, not once per test. A failing test is named in the suite's output.
#   cmake -D PROGRAM=<test program> -D OUTPUT=<file.cmake> -D PROPERTIES=<set_tests_properties arguments, |-joined>
#         -P MemgateTestSuites.cmake
execute_process(COMMAND "${PROGRAM}" --gtest_list_tests OUTPUT_VARIABLE listing ERROR_VARIABLE errors
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} --gtest_list_tests failed (${rc}):\n${errors}")
endif()
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
string(REPLACE "|" ";" properties "${PROPERTIES}")
set(script "")
foreach(line IN LISTS lines)
  # A suite's line: "Suite." or "Prefix/Suite.  # TypeParam = ..."; its tests' lines are indented.
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND script "add_test([==[${suite}]==] [==[${PROGRAM}]==] [==[--gtest_filter=${suite}.*]==])\n")
    set(props "")
    foreach(p IN LISTS properties)
      string(APPEND props " [==[${p}]==]")
    endforeach()
    string(APPEND script "set_tests_properties([==[${suite}]==] PROPERTIES${props})\n")
  endif()
endforeach()
file(WRITE "${OUTPUT}" "${script}")
