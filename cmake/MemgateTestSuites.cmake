# Run after a test program is built (memgate_add_test ... PER_SUITE): lists its GoogleTest suites and writes one CTest
# test per suite (--gtest_filter=<suite>.*), so that a program that loads LibTorch (0.4 s before any work) pays for it
# once per suite, not once per test. A parameterized suite (Prefix/Suite: one test per fixture or case, often
# seconds each) is split into up to 4 shards of 4 tests or more (GoogleTest's GTEST_TOTAL_SHARDS and
# GTEST_SHARD_INDEX), Suite.shard<k>of<n>, so that ctest -j spreads it over the cores; more shards would pay the 0.4 s
# more often (the 134 bad inputs of 0.3 s each were 34 shards, 45 s). A failing test is named in its test's output.
# The suites that DEV names (Suite|Prefix/Suite|..., or ALL) are labelled dev as well: the `dev` test preset.
# GROUPS (Suite,Suite,...[@N]|...): each group's suites run as one CTest test (Suite+Suite+..., or the suite's own name),
# in N shards (1 by default), instead of one test (or up to 4 shards) each: for suites whose processes each start a
# Python fork server that imports torch and the fixtures' packages (about 3 s, paid once per process, not per suite).
#   cmake -D PROGRAM=<test program> -D OUTPUT=<file.cmake> -D LABELS=<labels> -D ENVIRONMENT=<VAR=value|...>
#         -D PROPERTIES=<more set_tests_properties arguments, |-joined> [-D DEV=<suites>] [-D GROUPS=<groups>]
#         -P MemgateTestSuites.cmake
cmake_policy(SET CMP0057 NEW)  # if(... IN_LIST ...)
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
# A test of `filter` (GoogleTest's) named `name` in `shards` shards.
function(add_suite_test name filter shards labels)
  if(shards LESS_EQUAL 1)
    string(APPEND script "add_test([==[${name}]==] [==[${PROGRAM}]==] [==[--gtest_filter=${filter}]==])\n"
                         "set_tests_properties([==[${name}]==] PROPERTIES LABELS [==[${labels}]==] "
                         "ENVIRONMENT [==[${environment}]==]${more})\n")
  else()
    math(EXPR last "${shards} - 1")
    foreach(index RANGE ${last})
      math(EXPR k "${index} + 1")
      set(shard "${name}.shard${k}of${shards}")
      set(env "${environment};GTEST_TOTAL_SHARDS=${shards};GTEST_SHARD_INDEX=${index}")
      string(APPEND script "add_test([==[${shard}]==] [==[${PROGRAM}]==] [==[--gtest_filter=${filter}]==])\n"
                           "set_tests_properties([==[${shard}]==] PROPERTIES LABELS [==[${labels}]==] "
                           "ENVIRONMENT [==[${env}]==]${more})\n")
    endforeach()
  endif()
  set(script "${script}" PARENT_SCOPE)
endfunction()
function(suite_labels suite out)
  if(DEV STREQUAL "ALL" OR (DEV AND suite MATCHES "^(${DEV})$"))
    set(${out} "${LABELS};dev" PARENT_SCOPE)
  else()
    set(${out} "${LABELS}" PARENT_SCOPE)
  endif()
endfunction()

string(REPLACE "|" ";" groups "${GROUPS}")
set(grouped "")
foreach(group IN LISTS groups)
  set(shards 1)
  if(group MATCHES "^(.*)@([0-9]+)$")
    set(group "${CMAKE_MATCH_1}")
    set(shards "${CMAKE_MATCH_2}")
  endif()
  string(REPLACE "," ";" members "${group}")
  set(present "")
  set(filter "")
  set(labels "${LABELS};dev")  # dev only where every suite of the group is
  foreach(suite IN LISTS members)
    if(NOT suite IN_LIST suites)
      message(WARNING "${PROGRAM} has no suite ${suite} (GROUPS)")
      continue()
    endif()
    list(APPEND present "${suite}")
    list(APPEND grouped "${suite}")
    string(APPEND filter ":${suite}.*")
    suite_labels("${suite}" these)
    if(NOT these MATCHES "dev")
      set(labels "${LABELS}")
    endif()
  endforeach()
  if(present)
    list(JOIN present "+" name)
    string(SUBSTRING "${filter}" 1 -1 filter)
    add_suite_test("${name}" "${filter}" ${shards} "${labels}")
  endif()
endforeach()

foreach(suite IN LISTS suites)
  if(suite IN_LIST grouped)
    continue()
  endif()
  suite_labels("${suite}" labels)
  set(shards 1)
  if(suite MATCHES "/")
    math(EXPR shards "(${count_${suite}} + 3) / 4")
    if(shards GREATER 4)
      set(shards 4)
    endif()
  endif()
  add_suite_test("${suite}" "${suite}.*" ${shards} "${labels}")
endforeach()
file(WRITE "${OUTPUT}" "${script}")
