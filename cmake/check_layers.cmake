# check_layers.cmake — the layer rule, checked on the sources (the cpu test layers.includes):
#   cmake -DROOT=<source dir> -P cmake/check_layers.cmake
#
# The library's folders are layers, lowest first: core, generator, device, autotune, runtime. A
# file may include headers of its own layer and of the layers beneath it, and the public ones
# (include/lajit.h, templates/common/la_params.h); never a header of a higher layer. The build
# enforces most of this by giving each layer only its own and the lower layers' include
# directories (CMakeLists.txt), but a quoted include is looked up beside the including file
# first, so "../runtime/context.h" would compile anywhere; this reads every #include "..." of
# every .c and .h of the layers, resolves it as the compiler does (the including file's folder,
# then the include directories) and fails naming the file, the line and both layers. An include
# that resolves to nothing in the tree, or to a file outside the layers and the public headers,
# fails as well: the rule could not be checked for it. On success it prints which layer
# includes which.
if(NOT ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<source dir> -P check_layers.cmake")
endif()
set(layers core generator device autotune runtime)
# Searched after the including file's folder, in this order (a header's name is unique in the
# tree, so the order only matters for names the tree does not have).
set(search_dirs include templates/common ${layers})
string(REPLACE ";" ", " search_text "${search_dirs}")
string(REPLACE ";" " < " order "${layers}")

# The layer of a file (path relative to ROOT) into ${out}: its index in `layers`, -1 for the
# public headers, "" for anything else.
function(layer_of rel out)
  string(REGEX MATCH "^[^/]+" top "${rel}")
  list(FIND layers "${top}" i)
  if(i GREATER -1)
    set(${out} ${i} PARENT_SCOPE)
  elseif(top STREQUAL "include" OR rel MATCHES "^templates/common/")
    set(${out} -1 PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

set(problems "")
set(edges "")
foreach(layer IN LISTS layers)
  list(FIND layers ${layer} rank)
  file(GLOB files RELATIVE ${ROOT} ${ROOT}/${layer}/*.c ${ROOT}/${layer}/*.h)
  list(SORT files)
  foreach(rel IN LISTS files)
    get_filename_component(dir ${rel} DIRECTORY)
    file(READ ${ROOT}/${rel} text)
    # One list element per line. Characters that CMake's lists treat specially are replaced
    # first (only the include lines matter, and their names contain none of them).
    string(REPLACE "\\" "/" text "${text}")
    string(REPLACE ";" "," text "${text}")
    string(REPLACE "[" "(" text "${text}")
    string(REPLACE "]" ")" text "${text}")
    string(REPLACE "\n" ";" lines "${text}")
    set(n 0)
    foreach(line IN LISTS lines)
      math(EXPR n "${n} + 1")
      if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
        continue()
      endif()
      set(name ${CMAKE_MATCH_1})
      set(found "")
      foreach(d IN ITEMS ${dir} ${search_dirs})
        if(EXISTS ${ROOT}/${d}/${name} AND NOT IS_DIRECTORY ${ROOT}/${d}/${name})
          cmake_path(SET p NORMALIZE "${d}/${name}")
          set(found ${p})
          break()
        endif()
      endforeach()
      if(found STREQUAL "")
        list(APPEND problems "${rel}:${n}: #include \"${name}\" is in none of ${dir}/ and the \
include directories (${search_text})")
        continue()
      endif()
      layer_of(${found} to)
      if(to STREQUAL "")
        list(APPEND problems "${rel}:${n}: #include \"${name}\" is ${found}, outside the \
layers and the public headers")
      elseif(to GREATER rank)
        list(GET layers ${to} higher)
        list(APPEND problems "${rel}:${n}: #include \"${name}\" (${found}): layer ${layer}/ \
includes the higher layer ${higher}/")
      elseif(to GREATER -1 AND NOT to EQUAL rank)
        list(GET layers ${to} lower)
        list(APPEND edges "${layer} -> ${lower}")
      endif()
    endforeach()
  endforeach()
endforeach()

if(problems)
  list(LENGTH problems count)
  string(REPLACE ";" "\n  " text "${problems}")
  message(FATAL_ERROR "layer rule broken (${count}); lowest first: ${order}\n  ${text}")
endif()
list(REMOVE_DUPLICATES edges)
list(SORT edges)
string(REPLACE ";" "\n  " text "${edges}")
message(STATUS "layers hold; lowest first: ${order}. Includes between layers:\n  ${text}")
