# Run after a test program is built (memgate_add_test ... PER_SUITE): lists its GoogleTest suites and writes one CTest
# test per suite (--gtest_filter=<suite>.*), so that a program that loads LibTorch (0.4 s before any work) pays for it
# once per suite, not once per test. A parameterized suite (Prefix/Suite: one test per fixture or case, often
# seconds each) is split into up to 4 shards of 4 tests or more (GoogleTest's GTEST_TOTAL_SHARDS and
# GTEST_SHARD_INDEX), Suite.shard<k>of<n>, so that ctest -j spreads it over the cores; more shards would pay the 0.4 s
# more often (the 134 bad inputs of 0.3 s each were 34 shards, 45 s). A failing test is named in its test's output.
# The suites that DEV names (Suite|Prefix/Suite|..., or ALL) are labelled dev as well: the `dev` test preset.
#   cmake -D PROGRAM=<test program> -D OUTPUT=<file.cmake> -D LABELS=<labels> -D ENVIRONMENT=<VAR=value|...>
#         -D PROPERTIES=<more set_tests_properties arguments, |-joined> [-D DEV=<suites>] -P MemgateTestSuites.cmake
execute_process(COMMAND "${PROGRAM}" --gtest_list_tests OUTPUT_VARIABLE listing ERROR_VARIABLE errors
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} --gtest_list_tests failed (${rc}):\n${errors}")
endif()
string(REPLACE ";" "\\;" listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
string(REPLACE "|" ";" properties "${PROPERTIES}")
string(REPLACE "|" ";" environment "${ENVIRONMENT}")
set(suites "")
foreach(line IN LISTS lines)
  # A suite's line: "Suite." or "Prefix/Suite.  # TypeParam = ..."; its tests' lines are indented.
  if(line MATCHES "^([^ #][^ ]*)\\.( |$)")
    set(suite "${CMAKE_MATCH_1}")
    list(APPEND suites "${suite}")
    set(count_${suite} 0)
  elseif(line MATCHES "^  [^ ]" AND DEFINED suite)
    math(EXPR count_${suite} "${count_${suite}} + 1")
  endif()
endforeach()

set(more "")
foreach(p IN LISTS properties)
  string(APPEND more " [==[${p}]==]")
endforeach()
set(script "")
foreach(suite IN LISTS suites)
  set(labels "${LABELS}")
  if(DEV STREQUAL "ALL" OR (DEV AND suite MATCHES "^(${DEV})$"))
    set(labels "${LABELS};dev")
  endif()
  set(shards 1)
  if(suite MATCHES "/")
    math(EXPR shards "(${count_${suite}} + 3) / 4")
    if(shards GREATER 4)
      set(shards 4)
    endif()
  endif()
  if(shards LESS_EQUAL 1)
    set(env "${environment}")
    string(APPEND script "add_test([==[${suite}]==] [==[${PROGRAM}]==] [==[--gtest_filter=${suite}.*]==])\n"
                         "set_tests_properties([==[${suite}]==] PROPERTIES LABELS [==[${labels}]==] "
                         "ENVIRONMENT [==[${env}]==]${more})\n")
    continue()
  endif()
  math(EXPR last "${shards} - 1")
  foreach(index RANGE ${last})
    math(EXPR k "${index} + 1")
    set(name "${suite}.shard${k}of${shards}")
    set(env "${environment};GTEST_TOTAL_SHARDS=${shards};GTEST_SHARD_INDEX=${index}")
    string(APPEND script "add_test([==[${name}]==] [==[${PROGRAM}]==] [==[--gtest_filter=${suite}.*]==])\n"
                         "set_tests_properties([==[${name}]==] PROPERTIES LABELS [==[${labels}]==] "
                         "ENVIRONMENT [==[${env}]==]${more})\n")
  endforeach()
endforeach()
file(WRITE "${OUTPUT}" "${script}")
