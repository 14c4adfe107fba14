# ctest api_example_vs_cli: examples/denoise.c (the public C API only) and `layerstream
# forward --inputs` on the inputs the example wrote print the same output hash.
#   cmake -DEXAMPLE=... -DTOOL=... -DWORK=dir -P example_vs_cli.cmake
file(MAKE_DIRECTORY ${WORK})
set(inputs ${WORK}/example_inputs.safetensors)
execute_process(COMMAND ${EXAMPLE} ${inputs} OUTPUT_VARIABLE ex RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "example failed (${rc}): ${err}")
endif()
string(REGEX MATCH "output hash ([0-9a-f]+)" _ "${ex}")
set(h_example ${CMAKE_MATCH_1})
execute_process(COMMAND ${TOOL} forward -q --preset tiny --frames 22 --width 64 --height 64 --text-tokens 8
                        --sigma 0.7 --inputs ${inputs}
                OUTPUT_VARIABLE cli RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "layerstream forward failed (${rc}): ${err}")
endif()
string(REGEX MATCH "output hash ([0-9a-f]+)" _ "${cli}")
set(h_cli ${CMAKE_MATCH_1})
# Without --inputs the CLI's seeded inputs give another hash: the file was really read.
execute_process(COMMAND ${TOOL} forward -q --preset tiny --frames 22 --width 64 --height 64 --text-tokens 8
                        --sigma 0.7 OUTPUT_VARIABLE seeded)
string(REGEX MATCH "output hash ([0-9a-f]+)" _ "${seeded}")
set(h_seeded ${CMAKE_MATCH_1})
if(h_example STREQUAL "" OR NOT h_example STREQUAL h_cli)
  message(FATAL_ERROR "example hash '${h_example}' != forward --inputs hash '${h_cli}'")
endif()
if(h_seeded STREQUAL h_cli)
  message(FATAL_ERROR "forward --inputs gave the seeded run's hash ${h_seeded}: the inputs were not used")
endif()
message(STATUS "example and forward --inputs: ${h_example}")
