/* config.c — configuration text parsed back into an lj_config (config.h). */
#include "config.h"

#include <string.h>

#include "problem.h"

lajit_status lj_config_parse(lj_env *env, lj_family *f, const lj_config *base, const char *text,
                             lj_config *out)
{
    lj_config cfg = *base;
    int seen[LJ_MAX_PARAMS] = {0};
    char token[96];
    const char *q = text;
    lj_problem dummy;
    memset(&dummy, 0, sizeof dummy);
    while (*q) {
        while (*q == ' ')
            q++;
        if (!*q)
            break;
        size_t n = strcspn(q, " ");
        if (n >= sizeof token)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "configuration \"%s\": token too long",
                            text);
        memcpy(token, q, n);
        token[n] = 0;
        q += n;
        /* Only the family's parameters: lj_assign would also take problem fields (D=64) into
         * the dummy problem, which must not pass for a configuration. */
        size_t klen = strcspn(token, "=");
        int which = -1;
        for (int i = 0; i < cfg.n; i++)
            if (strlen(cfg.names[i]) == klen && strncmp(cfg.names[i], token, klen) == 0)
                which = i;
        if (which < 0 || token[klen] != '=')
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT,
                            "configuration \"%s\": %s is not a parameter of %s", text, token,
                            lj_family_name(f));
        if (seen[which]++)
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "configuration \"%s\": %s given twice",
                            text, cfg.names[which]);
        lajit_status st = lj_assign(env, f, token, &dummy, &cfg);
        if (st != LAJIT_OK)
            return st;
    }
    for (int i = 0; i < cfg.n; i++)
        if (!seen[i])
            return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "configuration \"%s\" lacks %s", text,
                            cfg.names[i]);
    *out = cfg;
    return LAJIT_OK;
}
