/* config.h — a configuration's text form read back: "BLOCK=64 WARPS=4", as lj_config_format
 * (family.h) writes it and as the tuning database, bundles and the CLI store it. The op path
 * parses every configuration it did not make itself (tuned, bundled) with this, then asks the
 * family's valid(). */
#ifndef LAJIT_CONFIG_H
#define LAJIT_CONFIG_H

#include "family.h"

/* Parses text for family f: every parameter exactly once, each value one of its candidates.
 * base: any complete configuration of f (the default), giving the parameter list. Returns
 * LAJIT_ERR_INVALID_ARGUMENT with a message quoting the text otherwise; *out is written only on
 * success. Uses f's Lua state (the value check). */
lajit_status lj_config_parse(lj_env *env, lj_family *f, const lj_config *base, const char *text,
                             lj_config *out);

#endif
