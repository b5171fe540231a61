# ptxas on the warpgroup-MMA kernels (wgmma_kernels.cu) for sm_90a: fails when ptxas serialises
# any kernel's wgmma instructions (its "Potential Performance Loss ... serialized" messages), or
# when the expected kernels were not compiled.
#   -DNVCC=<nvcc> -DSOURCE_DIR=<repository root> -DOUT=<object file>
execute_process(
  COMMAND ${NVCC} -std=c++17 -O3 -DHYSERVE_HAVE_CUDA=1
          --generate-code=arch=compute_90a,code=sm_90a -Xptxas -v
          -I${SOURCE_DIR}/kernels/include -I${SOURCE_DIR}/common/include -I${SOURCE_DIR}/kernels
          -I${SOURCE_DIR}/kernels/cuda -I${SOURCE_DIR}
          -c ${SOURCE_DIR}/tests/ptxas/wgmma_kernels.cu -o ${OUT}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(log "${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nvcc exited with ${rc}:\n${log}")
endif()
foreach(kernel moe_wgmma_kernel wgmma_linear_kernel)
  string(REGEX MATCHALL "Compiling entry function '[^']*${kernel}[^']*'" entries "${log}")
  list(LENGTH entries n)
  if(n EQUAL 0)
    message(FATAL_ERROR "ptxas compiled no ${kernel}:\n${log}")
  endif()
  message("${kernel}: ${n} instantiations compiled")
endforeach()
string(REGEX MATCHALL "[^\n]*instructions are serialized[^\n]*" serial "${log}")
if(serial)
  string(REPLACE ";" "\n" serial "${serial}")
  message(FATAL_ERROR "ptxas serialised wgmma instructions:\n${serial}")
endif()
message("no wgmma serialised")
