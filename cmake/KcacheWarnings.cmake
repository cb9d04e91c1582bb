# Warning flags shared by every kcache target. Warnings are errors by
# default; clang adds -Wthread-safety for the absl lock annotations.
function(kcache_target_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety)
  endif()
  if(KCACHE_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
