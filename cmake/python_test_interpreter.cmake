# ls_find_test_python(<out-var> "<import list>"): the first interpreter that imports the
# modules, of: the Python package's test interpreter (LAYERSTREAM_PYTHON_TEST_EXECUTABLE,
# when python/ is configured: its version matches the built extension), the one CMake
# found (Python3_EXECUTABLE) and the system's /usr/bin/python3 (Debian's python3-torch,
# python3-numpy, python3-pytest). <out-var> is empty when none does. Used by the
# Python-driven tests: tests/comfyui, its sliced tests, tests/lora.
function(ls_find_test_python out imports)
  set(found "")
  foreach(py ${LAYERSTREAM_PYTHON_TEST_EXECUTABLE} ${Python3_EXECUTABLE} /usr/bin/python3)
    if(py AND NOT found AND EXISTS ${py})
      execute_process(COMMAND ${py} -c "import ${imports}" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
      if(rc EQUAL 0)
        set(found ${py})
      endif()
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()
