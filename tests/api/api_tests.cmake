# Tests of the public API (included from tests/CMakeLists.txt). Label "unit".
# test_api*.cpp drive the C API: they link liblayerstream (only ls_ symbols exported,
# so linking the internal static library beside it clashes with nothing).
foreach(t test_api test_api_pack test_api_devices test_api_doors)
  if(TARGET ${t})
    target_link_libraries(${t} PRIVATE layerstream_shared)
  endif()
endforeach()
# The header alone as C11 with every warning an error.
add_test(NAME api_header_c11
  COMMAND ${CMAKE_C_COMPILER} -std=c11 -Wall -Wextra -pedantic -Werror -fsyntax-only
          -I${PROJECT_SOURCE_DIR}/include ${CMAKE_CURRENT_SOURCE_DIR}/api/header_c11.c)
add_test(NAME api_exports COMMAND ${CMAKE_COMMAND} -DLIB=$<TARGET_FILE:layerstream_shared>
         -P ${CMAKE_CURRENT_SOURCE_DIR}/api/check_exports.cmake)
add_test(NAME api_example_vs_cli COMMAND ${CMAKE_COMMAND} -DEXAMPLE=$<TARGET_FILE:ls_example_denoise>
         -DTOOL=$<TARGET_FILE:layerstream> -DWORK=${CMAKE_CURRENT_BINARY_DIR}/api_example
         -P ${CMAKE_CURRENT_SOURCE_DIR}/api/example_vs_cli.cmake)
add_test(NAME api_install_consumer COMMAND ${CMAKE_COMMAND} -DBUILD=${PROJECT_BINARY_DIR}
         -DSRC=${CMAKE_CURRENT_SOURCE_DIR}/api/consumer -DWORK=${CMAKE_CURRENT_BINARY_DIR}/api_install
         -DCC=${CMAKE_C_COMPILER} -P ${CMAKE_CURRENT_SOURCE_DIR}/api/install_consumer.cmake)
set_tests_properties(api_header_c11 api_exports api_example_vs_cli api_install_consumer PROPERTIES LABELS unit)
