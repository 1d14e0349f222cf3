# kvrelay_test(NAME SOURCES... LIBS ...): one GoogleTest binary, its tests
# registered with CTest one by one.
function(kvrelay_test name)
  cmake_parse_arguments(T "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE ${T_LIBS} rapidcheck_gtest rapidcheck
                        GTest::gtest GTest::gtest_main GTest::gmock)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
endfunction()
