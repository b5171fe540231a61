# Smoke run of hyserve-bench-spec (cmake -P) on a tiny synthetic CPU model: the program must exit
# 0 (every speculative output equal to plain decoding), print a table row per workload, batch
# and mode with "yes" in the identity column for n-gram and draft-model rows, and write a JSON
# report in which n-gram drafting really proposed tokens on the repetitive workload and the
# draft model really drafted (with the cost check off: on this tiny model a draft-model round
# does not pay, and with the step times carried from the warm-up the check rightly skips them).
#   -DTOOL=<hyserve-bench-spec> -DCONFIG=<yaml> -DJSON=<output file>
execute_process(
  COMMAND ${TOOL} ${CONFIG} --batches 1,2 --prompt-len 160 --new-tokens 16 --draft-tokens 3 --draft-layers 2
          --cost-check 0 --repetitive block --json ${JSON}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hyserve-bench-spec exited with ${rc}: ${err}")
endif()
foreach(load repetitive random)
  foreach(batch 1 2)
    if(NOT out MATCHES "${load} +${batch} plain +[0-9.]+ +1.00x")
      message(FATAL_ERROR "no plain row for ${load} batch ${batch}")
    endif()
    foreach(mode ngram draft_model)
      if(NOT out MATCHES "${load} +${batch} ${mode} +[0-9.]+ +[0-9.]+x +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9]+ +[0-9]+ +[0-9]+ yes")
        message(FATAL_ERROR "no identical ${mode} row for ${load} batch ${batch}")
      endif()
    endforeach()
  endforeach()
endforeach()
if(NOT out MATCHES "all speculative outputs identical to plain decoding")
  message(FATAL_ERROR "no identity line")
endif()
file(READ ${JSON} report)
if(NOT report MATCHES "\"identical\":true,\"results\"")
  message(FATAL_ERROR "the JSON report does not say identical: ${report}")
endif()
if(NOT report MATCHES "\"workload\":\"repetitive\",\"batch\":1,\"mode\":\"ngram\",[^}]*\"drafted\":[1-9]")
  message(FATAL_ERROR "n-gram drafting proposed nothing on the repetitive workload: ${report}")
endif()
if(NOT report MATCHES "\"mode\":\"draft_model\",[^}]*\"drafted\":[1-9]")
  message(FATAL_ERROR "the draft model drafted nothing: ${report}")
endif()
