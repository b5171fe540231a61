# Smoke run of hyserve-sparse-quality (cmake -P): the program must exit 0, print its table with
# one row for the budget, and write a JSON report naming that budget in which every decode
# step was sparse.
#   -DTOOL=<hyserve-sparse-quality> -DCONFIG=<yaml> -DJSON=<output file>
execute_process(
  COMMAND ${TOOL} ${CONFIG} --prompt-len 512 --steps 4 --budgets 64 --sink-pages 1 --recent-pages 2
          --prefill-chunk 256 --json ${JSON}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "hyserve-sparse-quality exited with ${rc}: ${err}")
endif()
if(NOT out MATCHES "budget_tokens +page_budget +mean_abs_diff +max_abs_diff +top1_agree")
  message(FATAL_ERROR "no table header in the output")
endif()
if(NOT out MATCHES "\n +64 +4 +[0-9.e+-]+ +[0-9.e+-]+ +[0-4]/4")
  message(FATAL_ERROR "no table row for the 64-token (4-page) budget")
endif()
file(READ ${JSON} report)
if(NOT report MATCHES "\"budget_tokens\":64")
  message(FATAL_ERROR "the JSON report has no entry for budget 64: ${report}")
endif()
# 512 prompt tokens are 32 pages > 4: every one of the 4 decode steps reads 4 pages.
if(NOT report MATCHES "\"sparse_steps\":4,\"pages_read_per_step\":4E0")
  message(FATAL_ERROR "the 4 decode steps were not all sparse over 4 pages: ${report}")
endif()
