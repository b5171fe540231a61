# One INTERFACE target carries every warning flag; targets link it privately.
add_library(hyserve_warnings INTERFACE)
target_compile_options(hyserve_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor -Werror=switch -Werror=return-type>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Werror=switch>)
