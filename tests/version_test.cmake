# cmake/version.cmake names the git commit only when the source directory is the top level
# of its git work tree (issue 25: an exported tree inside another checkout printed the
# enclosing repository's commit, marked dirty). Run by ctest (version_source_tree):
#   cmake -DVERSION_SCRIPT=.../cmake/version.cmake -DWORK=<scratch dir> -P tests/version_test.cmake
# Three trees: a git repository's top level (its commit), an exported copy inside it
# (not the repository's commit: "unknown"), and that copy with a RELEASE file (its text).
find_program(GIT git)
if(NOT GIT)
  message(STATUS "version_test: git not found; nothing to check")
  return()
endif()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/outer/exported")
set(G ${GIT} -c user.name=t -c user.email=t@t -c init.defaultBranch=main -c commit.gpgsign=false)
execute_process(COMMAND ${G} init -q WORKING_DIRECTORY "${WORK}/outer" RESULT_VARIABLE rc)
file(WRITE "${WORK}/outer/a.txt" "a\n")
execute_process(COMMAND ${G} add a.txt WORKING_DIRECTORY "${WORK}/outer")
execute_process(COMMAND ${G} commit -q -m a WORKING_DIRECTORY "${WORK}/outer" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "version_test: cannot make a git repository in ${WORK}/outer")
endif()
execute_process(COMMAND ${G} rev-parse --short=12 HEAD WORKING_DIRECTORY "${WORK}/outer"
                OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE)
file(WRITE "${WORK}/outer/a.txt" "changed\n")  # the outer tree is dirty, as the device copy was

function(commit_of src out)
  execute_process(COMMAND ${CMAKE_COMMAND} -DSRC=${src} -DOUT=${WORK}/v.h -DVERSION=0 -DBUILD_TYPE=t -DBACKENDS=cpu
                          -P ${VERSION_SCRIPT} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "version_test: version.cmake failed for ${src}")
  endif()
  file(STRINGS ${WORK}/v.h line REGEX "LS_GIT_COMMIT")
  string(REGEX REPLACE ".*LS_GIT_COMMIT \"(.*)\"" "\\1" c "${line}")
  set(${out} "${c}" PARENT_SCOPE)
endfunction()

commit_of("${WORK}/outer" top)
if(NOT top STREQUAL "${head}-dirty")
  message(FATAL_ERROR "version_test: the top level gave '${top}', expected '${head}-dirty'")
endif()
commit_of("${WORK}/outer/exported" inner)
if(NOT inner STREQUAL "unknown")
  message(FATAL_ERROR "version_test: an exported tree inside a checkout gave '${inner}', expected 'unknown' "
                      "(not the enclosing repository's ${head})")
endif()
file(WRITE "${WORK}/outer/exported/RELEASE" "0.1.0 commit 0123456789ab\n")
commit_of("${WORK}/outer/exported" rel)
if(NOT rel STREQUAL "0.1.0 commit 0123456789ab (release file)")
  message(FATAL_ERROR "version_test: the RELEASE file gave '${rel}'")
endif()
file(WRITE "${WORK}/outer/exported/RELEASE" "$Format:%h$\n")  # copied from a checkout, not git archive'd
commit_of("${WORK}/outer/exported" raw)
if(NOT raw STREQUAL "unknown")
  message(FATAL_ERROR "version_test: an unexpanded RELEASE placeholder gave '${raw}'")
endif()
message(STATUS "version_test: top level ${top}; exported ${inner}; RELEASE ${rel}")
