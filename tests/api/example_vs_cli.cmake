# ctest api_example_vs_cli: examples/denoise.c (the public C API only) and `layerstream
# forward --inputs` on the inputs the example wrote print the same output hash.
#   cmake -DEXAMPLE=... -DTOOL=... -DWORK=dir -P example_vs_cli.cmake
file(MAKE_DIRECTORY ${WORK})
set(inputs ${WORK}/example_inputs.safetensors)

# Runs the command in ARGN (`what` names it in the failure message; a failed run is
# fatal) and sets out_var to the output hash it prints ("" when none).
function(output_hash_of out_var what)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}): ${err}")
  endif()
  string(REGEX MATCH "output hash ([0-9a-f]+)" _ "${out}")
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

set(forward ${TOOL} forward -q --preset tiny --frames 22 --width 64 --height 64 --text-tokens 8 --sigma 0.7)
output_hash_of(h_example "example" ${EXAMPLE} ${inputs})
output_hash_of(h_cli "layerstream forward" ${forward} --inputs ${inputs})
# Without --inputs the CLI's seeded inputs give another hash: the file was really read.
output_hash_of(h_seeded "layerstream forward (seeded)" ${forward})
if(h_example STREQUAL "" OR NOT h_example STREQUAL h_cli)
  message(FATAL_ERROR "example hash '${h_example}' != forward --inputs hash '${h_cli}'")
endif()
if(h_seeded STREQUAL h_cli)
  message(FATAL_ERROR "forward --inputs gave the seeded run's hash ${h_seeded}: the inputs were not used")
endif()
message(STATUS "example and forward --inputs: ${h_example}")
