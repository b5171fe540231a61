# Smoke run of hyserve-bench-model (cmake -P) under mpirun -np NP on a tiny synthetic CPU model
# whose config has parallel.tp = NP: the program must exit 0, print a prefill line and a decode
# line per batch size (eager and through the service's sampled path), and write a JSON report
# (rank 0 only) that names the tensor-parallel degree and the collective. A functional check of
# the sharded path, not a speed measurement.
#   -DMPIEXEC=<mpirun> -DMPIFLAGS=<flags;...> -DNP=<ranks> -DTOOL=<hyserve-bench-model>
#   -DCONFIG=<yaml> -DJSON=<output file>
file(REMOVE ${JSON})
execute_process(
  COMMAND ${MPIEXEC} ${MPIFLAGS} -np ${NP} ${TOOL} ${CONFIG} --batches 1,3 --prompt-len 40 --decode-steps 3
          --prefill-len 100 --json ${JSON}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hyserve-bench-model under mpirun -np ${NP} exited with ${rc}: ${err}")
endif()
if(NOT out MATCHES "prefill +100 tokens: +[0-9.]+ ms")
  message(FATAL_ERROR "no prefill line")
endif()
foreach(batch 1 3)
  foreach(path "eager" "sampled on the device")
    if(NOT out MATCHES "decode +batch +${batch} \\(context 40\\) ${path}: step +[0-9.]+ ms")
      message(FATAL_ERROR "no ${path} decode line for batch ${batch}")
    endif()
  endforeach()
endforeach()
# Rank 0 alone prints: one prefill line, not one per rank.
string(REGEX MATCHALL "prefill +100 tokens" lines "${out}")
list(LENGTH lines n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "${n} prefill lines (only rank 0 prints)")
endif()
file(READ ${JSON} report)
if(NOT report MATCHES "\"tp\":${NP},\"collective\":\"mpi\"")
  message(FATAL_ERROR "the JSON report does not name tp ${NP} and the MPI collective: ${report}")
endif()
