# teraio_find_torch(): finds libtorch in the torch wheel of the project's Python (a macro, so
# TORCH_LIBRARIES and friends land in the caller's scope). That Python is -DPython3_EXECUTABLE when
# given, else .venv/bin/python3 (the project's virtual environment, made by scripts/venv.sh) when it
# exists, else the one FindPython3 finds. Used by src/torch and src/train, which are built only with
# -DTERAIO_WITH_TORCH=ON. A build directory that found another torch before forgets that one.
macro(teraio_find_torch)
  if(NOT Python3_EXECUTABLE AND EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python3")
    set(Python3_EXECUTABLE "${PROJECT_SOURCE_DIR}/.venv/bin/python3" CACHE FILEPATH
        "The Python whose torch wheel libtorch comes from")
  endif()
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch;print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _teraio_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _teraio_torch_rc)
  if(NOT _teraio_torch_rc EQUAL 0)
    message(FATAL_ERROR "TERAIO_WITH_TORCH=ON but `import torch` fails with ${Python3_EXECUTABLE}: "
                        "run scripts/install_torch.sh (torch into .venv), or configure with "
                        "-DPython3_EXECUTABLE=/path/to/python3 of a Python that has torch")
  endif()
  # Torch_DIR, Caffe2_DIR and the library paths are cached: drop those of a torch found before.
  if(DEFINED CACHE{TERAIO_TORCH_PREFIX} AND NOT "$CACHE{TERAIO_TORCH_PREFIX}" STREQUAL "${_teraio_torch_prefix}")
    get_filename_component(_teraio_old_torch "$CACHE{TERAIO_TORCH_PREFIX}/../.." ABSOLUTE)
    message(STATUS "teraio: torch changed from ${_teraio_old_torch} (forgotten) to ${_teraio_torch_prefix}")
    get_cmake_property(_teraio_cached CACHE_VARIABLES)
    foreach(_v IN LISTS _teraio_cached)
      string(FIND "$CACHE{${_v}}" "${_teraio_old_torch}/" _teraio_at)
      if(_teraio_at EQUAL 0)
        unset(${_v} CACHE)
      endif()
    endforeach()
  endif()
  set(TERAIO_TORCH_PREFIX "${_teraio_torch_prefix}" CACHE INTERNAL "torch.utils.cmake_prefix_path")
  list(APPEND CMAKE_PREFIX_PATH "${_teraio_torch_prefix}")
  set(Python_EXECUTABLE "${Python3_EXECUTABLE}")  # the one torch's own CMake files run, if any
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})  # else Caffe2's config probes a GPU (none on CI machines)
    set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
  endif()
  find_package(Torch REQUIRED)
endmacro()

# teraio_torch_wheel(): torch for the Python extension (TERAIO_PYTHON, which setup.py configures):
# the headers and libraries of the torch package of Python3_EXECUTABLE, taken as
# torch.utils.cpp_extension takes them, not through torch's CMake package, whose Caffe2 part
# insists on a CUDA toolkit whenever torch was built with CUDA (a CPU-only build against PyPI's CUDA
# torch must not need one). Defines
#   teraio_torch_wheel   torch's include directories and c10, torch, torch_cpu (+ c10_cuda and
#                        torch_cuda when TERAIO_TORCH_WHEEL_CUDA);
#   teraio_torch_python  libtorch_python, which only the module links;
#   fmt::fmt             torch's own fmt headers, header-only (FMT_HEADER_ONLY): torch's include
#                        directory shadows the system's fmt, so one fmt is used throughout;
# and sets TERAIO_TORCH_DIR (the torch package, unless given) and TERAIO_TORCH_WHEEL_CUDA (CUDA on: TERAIO_CUDA is
# not OFF, the toolkit was found and torch has its CUDA libraries).
macro(teraio_torch_wheel)
  find_package(Python3 COMPONENTS Interpreter Development.Module REQUIRED)
  # setup.py says where torch is (-DTERAIO_TORCH_DIR): inside pip's isolated build environment a
  # child Python would not see the installed torch.
  if(NOT TERAIO_TORCH_DIR)
    execute_process(COMMAND ${Python3_EXECUTABLE} -c "import os, torch; print(os.path.dirname(torch.__file__))"
                    OUTPUT_VARIABLE TERAIO_TORCH_DIR OUTPUT_STRIP_TRAILING_WHITESPACE
                    RESULT_VARIABLE _teraio_torch_rc)
    if(NOT _teraio_torch_rc EQUAL 0)
      message(FATAL_ERROR "`import torch` fails with ${Python3_EXECUTABLE}: install torch there, or "
                          "configure with -DPython3_EXECUTABLE=/path/to/python3 of a Python that has it")
    endif()
  endif()
  if(NOT EXISTS ${TERAIO_TORCH_DIR}/include/torch/extension.h)
    message(FATAL_ERROR "TERAIO_TORCH_DIR=${TERAIO_TORCH_DIR} is not a torch package with its headers")
  endif()
  add_library(teraio_torch_wheel INTERFACE)
  target_include_directories(teraio_torch_wheel SYSTEM INTERFACE
                             ${TERAIO_TORCH_DIR}/include ${TERAIO_TORCH_DIR}/include/torch/csrc/api/include)
  set(_teraio_torch_libs c10 torch torch_cpu)
  set(TERAIO_TORCH_WHEEL_CUDA OFF)
  if(CUDAToolkit_FOUND)
    if(EXISTS ${TERAIO_TORCH_DIR}/lib/libc10_cuda.so)
      set(TERAIO_TORCH_WHEEL_CUDA ON)
      list(APPEND _teraio_torch_libs c10_cuda torch_cuda)
    elseif(_teraio_cuda STREQUAL "ON")
      message(FATAL_ERROR "TERAIO_CUDA=ON but the torch in ${TERAIO_TORCH_DIR} has no CUDA libraries "
                          "(a CPU-only torch): install a CUDA build of torch, or use TERAIO_CUDA=0")
    endif()
  endif()
  foreach(_teraio_lib IN LISTS _teraio_torch_libs ITEMS torch_python)
    if(NOT EXISTS ${TERAIO_TORCH_DIR}/lib/lib${_teraio_lib}.so)
      message(FATAL_ERROR "${TERAIO_TORCH_DIR}/lib/lib${_teraio_lib}.so not found: is torch installed completely?")
    endif()
  endforeach()
  list(TRANSFORM _teraio_torch_libs REPLACE "(.+)" "${TERAIO_TORCH_DIR}/lib/lib\\1.so")
  target_link_libraries(teraio_torch_wheel INTERFACE ${_teraio_torch_libs})
  add_library(teraio_torch_python INTERFACE)
  target_link_libraries(teraio_torch_python INTERFACE ${TERAIO_TORCH_DIR}/lib/libtorch_python.so)
  add_library(teraio_fmt INTERFACE)
  target_include_directories(teraio_fmt SYSTEM INTERFACE ${TERAIO_TORCH_DIR}/include)
  target_compile_definitions(teraio_fmt INTERFACE FMT_HEADER_ONLY)
  add_library(fmt::fmt ALIAS teraio_fmt)
  message(STATUS "teraio: Python extension against torch ${TERAIO_TORCH_DIR} (CUDA ${TERAIO_TORCH_WHEEL_CUDA})")
endmacro()

# teraio_cupti_include(TARGET TORCH_DIR): where `target` finds cupti.h (src/torch/kernel_timer.cpp):
# the CUDA toolkit's include directory, else the CUDA wheels torch depends on (nvidia/cu13 or
# nvidia/cuda_cupti next to the torch package TORCH_DIR), searched after everything else
# (-idirafter) so they never shadow the toolkit's headers. Without it, kernel times come from CUDA
# events (Note [Kernel times from CUPTI]).
function(teraio_cupti_include target torch_dir)
  foreach(_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(EXISTS ${_dir}/cupti.h)
      return()
    endif()
  endforeach()
  get_filename_component(_site ${torch_dir} DIRECTORY)
  foreach(_wheel cu13 cuda_cupti)
    if(EXISTS ${_site}/nvidia/${_wheel}/include/cupti.h)
      target_compile_options(${target} PRIVATE -idirafter ${_site}/nvidia/${_wheel}/include)
      return()
    endif()
  endforeach()
  message(STATUS "teraio_torch: cupti.h not found; CUDA kernel times come from CUDA events")
endfunction()
