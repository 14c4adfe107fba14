# tests/lora: `layerstream merge-lora` against ComfyUI's merge formula restated in torch
# (CPU). Needs a Python with torch, numpy and pytest (Debian: python3-torch, python3-numpy,
# python3-pytest): the interpreter the Python package's tests use when it is configured
# (LAYERSTREAM_PYTHON_TEST_EXECUTABLE), else the first of python3 / /usr/bin/python3 that
# imports them. Without one the test is not registered (a configure message says so).
include(${PROJECT_SOURCE_DIR}/cmake/python_test_interpreter.cmake)
ls_find_test_python(LS_LORA_PY "torch, numpy, pytest")
if(LS_LORA_PY)
  add_test(NAME LoraPy.MergeEqualsComfyUIFormula
           COMMAND ${LS_LORA_PY} -m pytest -q -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/test_lora_comfy_formula.py)
  set_tests_properties(LoraPy.MergeEqualsComfyUIFormula PROPERTIES LABELS unit
                       ENVIRONMENT "LS_TOOL=$<TARGET_FILE:layerstream>")
  # The int8 / fp8 side path's distance to ComfyUI's requantised merge (docs/lora.md).
  add_test(NAME LoraPy.SidePathDistanceToComfyUI
           COMMAND ${LS_LORA_PY} -m pytest -q -s -p no:cacheprovider ${CMAKE_CURRENT_LIST_DIR}/test_lora_side_distance.py)
  set_tests_properties(LoraPy.SidePathDistanceToComfyUI PROPERTIES LABELS unit)
else()
  message(STATUS "tests/lora not registered: no python3 with torch, numpy and pytest")
endif()
