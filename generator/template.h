/* template.h — the template engine: CUDA text with embedded Lua (see templates/README.md).
 *
 *   //% <lua statement>    a whole line of Lua (loops, conditionals, local definitions)
 *   ${<lua expression>}    substitution inside a text line (integers print as integers)
 *   $${                    a literal "${"
 *
 * The template is translated into a Lua chunk that appends text pieces, and run in the
 * sandbox with the given constants as globals. The output starts with #line and repeats it
 * wherever the output line stops following the template line, so NVRTC errors point at
 * template lines. */
#ifndef LAJIT_TEMPLATE_H
#define LAJIT_TEMPLATE_H

#include "sandbox.h"

/* Translation only (for tests and `lajit expand --lua`): the Lua chunk for a template. */
lajit_status lj_template_translate(lj_env *env, const char *name, const char *text, size_t len,
                                   char **lua_code);

/* Expands `text` (named `name`, e.g. "la_recurrent/recurrent.cu") with the table at stack index
 * consts_index of L as its global constants (read-only to the template; the standard sandbox
 * functions remain visible). *out freed with lj_free. */
lajit_status lj_template_expand(lj_lua *L, const char *name, const char *text, size_t len,
                                int consts_index, char **out);

#endif
