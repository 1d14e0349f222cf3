# kvrelay_test(NAME [PROC] SOURCES... LIBS ...): one GoogleTest binary, its
# tests registered with CTest one by one. Unit tests are labelled `unit` and
# gathered into the `unit_tests` target (scripts/sanitize builds and runs
# just those under ASan+UBSan); PROC marks a multi-process test, which
# labels its own tests `proc` (tests/CMakeLists.txt).
#
# With KVRELAY_WHOLE_UNIT_TESTS (the asan preset) a unit-test binary is one
# CTest test that runs all of its tests in one process. Under ASan most of a
# one-test process is the sanitizer's start and leak check: one process per
# test, the 801 unit tests took 108 test-seconds; the binaries whole, 39 s
# (both at -O1). The release tree keeps one CTest test per GoogleTest test:
# each alone, each with its own time.
option(KVRELAY_WHOLE_UNIT_TESTS "One CTest test per unit-test binary, not per test" OFF)

function(kvrelay_test name)
  cmake_parse_arguments(T "PROC" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_compile_options(${name} PRIVATE ${KVRELAY_TEST_FLAGS})   # CMakeLists.txt says why
  target_link_libraries(${name} PRIVATE ${T_LIBS} rapidcheck_gtest rapidcheck
                        GTest::gtest GTest::gtest_main GTest::gmock)
  if(T_PROC)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
    return()
  endif()
  if(KVRELAY_WHOLE_UNIT_TESTS)
    add_test(NAME ${name} COMMAND ${name} --gtest_brief=1)
    set_tests_properties(${name} PROPERTIES TIMEOUT 600 LABELS unit)
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS unit)
  endif()
  set_property(GLOBAL APPEND PROPERTY KVRELAY_UNIT_TESTS ${name})
endfunction()
