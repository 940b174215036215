/* embedded.h — the template tree (every file under templates/) compiled into the library at
 * cmake/embed.cmake, so the library is self-contained. Paths are relative to templates/. */
#ifndef LAJIT_EMBEDDED_H
#define LAJIT_EMBEDDED_H

#include <stddef.h>

typedef struct lj_embedded_file {
    const char *path; /* "la_recurrent/family.lua" */
    const char *data; /* NUL-terminated */
    size_t size;
} lj_embedded_file;

extern const lj_embedded_file lj_embedded_files[];
extern const size_t lj_embedded_count;
/* Names of the families (folders holding a family.lua), NULL-terminated. */
extern const char *const lj_embedded_families[];

/* The file at path, or NULL. */
const lj_embedded_file *lj_embedded_find(const char *path);

#endif
