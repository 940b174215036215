/* nccl_test.c — NCCL for gpu tests (nccl_test.h). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_test.h"
#include "test.h"

/* The nvidia-nccl wheel's library, when python3 imports nvidia.nccl; "" otherwise. */
static void wheel_path(char *out, size_t cap)
{
    out[0] = 0;
    FILE *p = popen("python3 -c 'import nvidia.nccl, os; "
                    "print(os.path.join(list(nvidia.nccl.__path__)[0], \"lib\", "
                    "\"libnccl.so.2\"))' 2>/dev/null",
                    "r");
    if (!p)
        return;
    if (!fgets(out, (int)cap, p))
        out[0] = 0;
    pclose(p);
    out[strcspn(out, "\n")] = 0;
}

const lj_nccl *lj_test_nccl_or_skip(void)
{
    const char *env_path = getenv("LAJIT_NCCL_PATH");
    if (!env_path || !*env_path) {
        void *probe = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (probe) {
            dlclose(probe);
        } else {
            char line[1024];
            wheel_path(line, sizeof line);
            if (line[0])
                setenv("LAJIT_NCCL_PATH", line, 1);
        }
    }
    const lj_nccl *nccl = NULL;
    lj_env env;
    lj_env_init(&env, NULL, NULL, NULL, NULL, LAJIT_LOG_ERROR);
    if (lj_nccl_load(&env, &nccl) != LAJIT_OK) {
        char why[sizeof env.errmsg + 64];
        snprintf(why, sizeof why, "%s (set LAJIT_NCCL_PATH to libnccl.so.2)", env.errmsg);
        lj_test_skip(why);
    }
    return nccl;
}
