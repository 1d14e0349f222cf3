# kvrelay_test(NAME [PROC] SOURCES... LIBS ...): one GoogleTest binary, its
# tests registered with CTest one by one. Unit tests are labelled `unit` and
# gathered into the `unit_tests` target (scripts/sanitize builds and runs
# just those under ASan+UBSan); PROC marks a multi-process test, which
# labels its own tests `proc` (tests/CMakeLists.txt).
function(kvrelay_test name)
  cmake_parse_arguments(T "PROC" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_compile_options(${name} PRIVATE ${KVRELAY_TEST_FLAGS})   # CMakeLists.txt says why
  target_link_libraries(${name} PRIVATE ${T_LIBS} rapidcheck_gtest rapidcheck
                        GTest::gtest GTest::gtest_main GTest::gmock)
  if(T_PROC)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600 LABELS unit)
    set_property(GLOBAL APPEND PROPERTY KVRELAY_UNIT_TESTS ${name})
  endif()
endfunction()
