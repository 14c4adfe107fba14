# tests/comfyui/test_sliced*.py: the node's comfy-sliced path (issue 18) against stock by
# torch.equal on tests/reference/comfy_modules.py. Include from tests/CMakeLists.txt:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/comfyui/sliced.cmake)
# Needs a Python with torch and pytest (Debian: python3-torch, python3-pytest): the
# interpreter the Python package's tests use when configured (LAYERSTREAM_PYTHON_TEST_EXECUTABLE),
# else the first of Python3_EXECUTABLE / /usr/bin/python3 that imports them; without one the
# tests are not registered (a configure message says so).
#   ComfyuiSliced.Cpu  label unit: CPU, any PyTorch >= 1.13 (the CPU kernel probe runs on 1.13)
#   ComfyuiSliced.Gpu  label cuda (LAYERSTREAM_CUDA builds): real widths on the GPU, prints the
#                      kernel-threshold and stock-vs-sliced tables (pytest -s)
set(LS_SLICED_PY "")
foreach(py ${LAYERSTREAM_PYTHON_TEST_EXECUTABLE} ${Python3_EXECUTABLE} /usr/bin/python3)
  if(py AND NOT LS_SLICED_PY)
    execute_process(COMMAND ${py} -c "import torch, pytest" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(LS_SLICED_PY ${py})
    endif()
  endif()
endforeach()
if(LS_SLICED_PY)
  add_test(NAME ComfyuiSliced.Cpu
           COMMAND ${LS_SLICED_PY} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/test_sliced.py)
  set_tests_properties(ComfyuiSliced.Cpu PROPERTIES LABELS unit TIMEOUT 600)
  if(LAYERSTREAM_CUDA)
    add_test(NAME ComfyuiSliced.Gpu
             COMMAND ${LS_SLICED_PY} -m pytest -s -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/test_sliced_gpu.py)
    set_tests_properties(ComfyuiSliced.Gpu PROPERTIES LABELS cuda TIMEOUT 1200)
  endif()
else()
  message(STATUS "tests/comfyui sliced tests not registered: no python3 with torch and pytest")
endif()
