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
