# embed_test.cmake — installs the build into WORK/prefix, builds examples/embed against it with
# find_package(lajit) and with pkg-config, and runs both. Exit 3 (no GPU, reported by lajit) or
# 0 (GPU present, result checked) pass; anything else fails.
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BINARY} --prefix ${WORK}/prefix
                RESULT_VARIABLE rc OUTPUT_QUIET)
if(rc)
  message(FATAL_ERROR "install failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE}/examples/embed -B ${WORK}/build
                        -DCMAKE_PREFIX_PATH=${WORK}/prefix RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configure of the example against the installed package failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "build of the example failed")
endif()
include(GNUInstallDirs)
set(libdir ${WORK}/prefix/${CMAKE_INSTALL_LIBDIR})
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} LAJIT_CACHE_DIR=${WORK}/cache
                        ${WORK}/build/embed RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 AND NOT rc EQUAL 3)
  message(FATAL_ERROR "the example (find_package) exited ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${libdir}/pkgconfig
                        pkg-config --cflags --libs lajit OUTPUT_VARIABLE pcflags RESULT_VARIABLE rc
                        OUTPUT_STRIP_TRAILING_WHITESPACE)
if(rc)
  message(FATAL_ERROR "pkg-config does not know the installed lajit")
endif()
separate_arguments(pcflags)
execute_process(COMMAND cc -std=c11 -Wall -Wextra -Werror -o ${WORK}/embed-pc
                        ${SOURCE}/examples/embed/main.c ${pcflags} -ldl -lm RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "build of the example with pkg-config failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E env LD_LIBRARY_PATH=${libdir} LAJIT_CACHE_DIR=${WORK}/cache
                        ${WORK}/embed-pc RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 AND NOT rc EQUAL 3)
  message(FATAL_ERROR "the example (pkg-config) exited ${rc}")
endif()
