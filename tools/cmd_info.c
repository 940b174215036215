/* cmd_info.c — `lajit info`: the CUDA driver, NVRTC, the devices (or "no GPU") with the shipped
 * tuning table each would use, the cache directory and the built-in families; what a bug report
 * or a first install wants to know. */
#include <stdio.h>

#include "cli.h"
#include "nvrtc.h"
#include "tuned.h"

/* The shipped tuning table device d would use (autotune/tuned.h), or why none. */
static void print_table(lj_env *env, const lj_device *d, int driver, int nvrtc_major,
                        int nvrtc_minor)
{
    lj_fingerprint fp;
    lj_fingerprint_make(&d->info, driver, nvrtc_major, nvrtc_minor, &fp);
    char slug[128], path[1024];
    lj_tuned_slug(fp.name, slug, sizeof slug);
    lj_tunedb *t = NULL;
    lajit_status st = lj_tuned_load(env, &fp, &t, path, sizeof path);
    if (st != LAJIT_OK)
        printf("          tuned table refused: %s\n", env->errmsg);
    else if (t)
        printf("          tuned table %s\n", path);
    else
        printf("          tuned table none (%s.json)\n", slug);
    lj_tunedb_close(t);
    lj_clear_error(env);
}

int cmd_info(int argc, char **argv)
{
    int rc = cli_no_arguments("info",
                              "Prints the CUDA driver, NVRTC, the devices (or \"no GPU\") with "
                              "the shipped tuning table each uses, the cache directory and the "
                              "built-in families.\n",
                              argc, argv);
    if (rc >= 0)
        return rc;
    lajit_ctx *ctx = cli_open_ctx(-1, 0);
    if (!ctx)
        return 1;
    lj_env *env = lajit__ctx_env(ctx);
    printf("lajit     %s\n", lajit_version_string());
    int major = 0, minor = 0;
    lajit_status st = lj_nvrtc_version(env, &major, &minor);
    if (st != LAJIT_OK)
        major = minor = 0; /* kernels compiled elsewhere are filed under NVRTC 0 */
    if (st == LAJIT_OK)
        printf("NVRTC     %d.%d\n", major, minor);
    else
        printf("NVRTC     not available (%s)\n", lajit_errmsg(ctx));
    printf("cache     %s\n", ctx->cache_dir ? ctx->cache_dir : "(memory only)");
    if (ctx->template_dir)
        printf("templates %s (LAJIT_TEMPLATE_DIR)\n", ctx->template_dir);
    const lj_driver *drv;
    st = lj_driver_load(env, &drv);
    if (st != LAJIT_OK) {
        printf("driver    none: %s\n", lajit_errmsg(ctx));
        printf("devices   no GPU\n");
    } else {
        int version = 0, count = 0;
        LJ_CU(env, drv, cuDriverGetVersion, &version);
        LJ_CU(env, drv, cuDeviceGetCount, &count);
        printf("driver    CUDA %d.%d\n", version / 1000, (version % 1000) / 10);
        if (count == 0)
            printf("devices   no GPU\n");
        for (int i = 0; i < count; i++) {
            lj_device d;
            if (lj_device_open(env, drv, i, &d) == LAJIT_OK) {
                printf("device %d  %s, %s, %d SMs, %d KiB shared memory per block, %d MiB L2\n", i,
                       d.info.name, d.info.arch, d.info.sms, d.info.smem_optin / 1024,
                       d.info.l2_bytes >> 20);
                print_table(env, &d, version, major, minor);
                lj_device_close(env, &d);
            } else {
                printf("device %d  unusable: %s\n", i, lajit_errmsg(ctx));
            }
        }
    }
    printf("families ");
    for (const char *const *f = lajit_family_names(); *f; f++)
        printf(" %s", *f);
    printf("\n");
    lajit_ctx_destroy(ctx);
    return 0;
}
