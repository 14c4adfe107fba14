# ctest api_install_consumer: `cmake --install` into a temporary prefix, then a tiny
# consumer project (examples/denoise.c) built twice against it: with
# find_package(layerstream) and with pkg-config (layerstream.pc). Both must build and run.
#   cmake -DBUILD=build-dir -DSRC=tests/api/consumer -DWORK=dir -DCC=cc -P install_consumer.cmake
file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_out "${out}" PARENT_SCOPE)
endfunction()
run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
# find_package
run("configure (find_package)" ${CMAKE_COMMAND} -S ${SRC} -B ${WORK}/cmake-build -DCMAKE_PREFIX_PATH=${prefix}
    -DCMAKE_BUILD_TYPE=Release)
run("build (find_package)" ${CMAKE_COMMAND} --build ${WORK}/cmake-build)
run("run (find_package)" ${WORK}/cmake-build/consumer)
message(STATUS "find_package consumer: ${last_out}")
# pkg-config
file(GLOB_RECURSE pcs ${prefix}/*/layerstream.pc)
list(LENGTH pcs npc)
if(NOT npc EQUAL 1)
  message(FATAL_ERROR "expected one installed layerstream.pc, found: ${pcs}")
endif()
get_filename_component(pcdir ${pcs} DIRECTORY)
set(ENV{PKG_CONFIG_PATH} ${pcdir})
run("pkg-config --cflags" pkg-config --cflags layerstream)
string(STRIP "${last_out}" cflags)
run("pkg-config --libs" pkg-config --libs layerstream)
string(STRIP "${last_out}" libs)
run("pkg-config --variable=libdir" pkg-config --variable=libdir layerstream)
string(STRIP "${last_out}" libdir)
separate_arguments(cflags UNIX_COMMAND "${cflags}")
separate_arguments(libs UNIX_COMMAND "${libs}")
# No -rpath and no LD_LIBRARY_PATH here: the .pc file's Libs carry the rpath (issue 28).
run("cc (pkg-config)" ${CC} -std=c11 -Wall -Wextra -pedantic -Werror ${cflags} ${SRC}/../../../examples/denoise.c -o ${WORK}/consumer-pc
    ${libs})
set(ENV{LD_LIBRARY_PATH} "")
run("run (pkg-config)" ${WORK}/consumer-pc)
message(STATUS "pkg-config consumer: ${last_out}")
