# check_format.cmake — the tree follows .clang-format (the cpu test style.clang_format):
#   cmake -DROOT=<source dir> [-DCLANG_FORMAT=clang-format] -P cmake/check_format.cmake
#
# Every .c and .h of the host code (the library's layers, the public header, tools, tests, bench,
# examples) is run through `clang-format --dry-run -Werror`; the templates are not (their own
# .clang-format disables formatting: the expanded CUDA is what the golden tests compare), nor
# the fuzz corpora (data). Exits 77 (CTest: skipped) when clang-format is not installed, so a
# machine without it says so rather than passing; scripts/setup.sh installs it.
if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P check_format.cmake")
endif()
if(NOT CLANG_FORMAT)
  find_program(CLANG_FORMAT NAMES clang-format clang-format-14 clang-format-15 clang-format-16)
endif()
if(NOT CLANG_FORMAT)
  message("clang-format not found: the style check cannot run")
  cmake_language(EXIT 77)
endif()
set(files)
foreach(dir core generator device autotune runtime include tools tests/cpu tests/gpu
            tests/support tests/ref tests/fuzz bench examples)
  file(GLOB_RECURSE found "${ROOT}/${dir}/*.c" "${ROOT}/${dir}/*.h")
  list(FILTER found EXCLUDE REGEX "/tests/fuzz/corpus/")
  list(APPEND files ${found})
endforeach()
list(LENGTH files n)
execute_process(COMMAND ${CLANG_FORMAT} --dry-run -Werror ${files}
                WORKING_DIRECTORY "${ROOT}" RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message("${err}")
  message(FATAL_ERROR "${n} files checked: some do not follow .clang-format "
                      "(fix with: clang-format -i FILE)")
endif()
message("${n} files follow .clang-format")
