# teraio_find_torch(): finds libtorch in the torch wheel that `python3` imports (a macro, so
# TORCH_LIBRARIES and friends land in the caller's scope). Used by src/torch and src/train, which
# are built only with -DTERAIO_WITH_TORCH=ON.
macro(teraio_find_torch)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import torch;print(torch.utils.cmake_prefix_path)"
                  OUTPUT_VARIABLE _teraio_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
                  RESULT_VARIABLE _teraio_torch_rc)
  if(NOT _teraio_torch_rc EQUAL 0)
    message(FATAL_ERROR "TERAIO_WITH_TORCH=ON but `import torch` fails with ${Python3_EXECUTABLE}")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${_teraio_torch_prefix}")
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})  # else Caffe2's config probes a GPU (none on CI machines)
    set(ENV{TORCH_CUDA_ARCH_LIST} "9.0")
  endif()
  find_package(Torch REQUIRED)
endmacro()
