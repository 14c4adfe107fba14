# tests/comfyui/test_sliced*.py: the node's comfy-sliced path (issue 18) against stock by
# torch.equal on tests/reference/comfy_modules.py. Included from tests/comfyui/CMakeLists.txt
# (after its interpreter search) or on its own:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/sliced.cmake)
# The interpreter: LS_COMFYUI_PY when the node tests found one, else the first of
# LAYERSTREAM_PYTHON_TEST_EXECUTABLE / Python3_EXECUTABLE / /usr/bin/python3 that imports torch
# and pytest (Debian: python3-torch, python3-pytest); without one the tests are not registered.
#   comfyui_test_sliced      labels unit;comfyui  CPU, any PyTorch >= 1.13 (the CPU kernel probe runs on 1.13)
#   comfyui_test_sliced_gpu  labels cuda;comfyui  LAYERSTREAM_CUDA builds: real widths on the GPU; prints the
#                            kernel-threshold and stock-vs-sliced tables (pytest -s)
set(LS_SLICED_PY "${LS_COMFYUI_PY}")
if(NOT LS_SLICED_PY)
  include(${PROJECT_SOURCE_DIR}/cmake/python_test_interpreter.cmake)
  ls_find_test_python(LS_SLICED_PY "torch, pytest")
endif()
if(LS_SLICED_PY)
  add_test(NAME comfyui_test_sliced
           COMMAND ${LS_SLICED_PY} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/test_sliced.py
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(comfyui_test_sliced PROPERTIES LABELS "unit;comfyui" TIMEOUT 600)
  if(LAYERSTREAM_CUDA)
    add_test(NAME comfyui_test_sliced_gpu
             COMMAND ${LS_SLICED_PY} -m pytest -s -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/test_sliced_gpu.py
             WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(comfyui_test_sliced_gpu PROPERTIES LABELS "cuda;comfyui" TIMEOUT 1200)
  endif()
else()
  message(STATUS "tests/comfyui sliced tests not registered: no python3 with torch and pytest")
endif()
