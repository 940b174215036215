/* levels.c — the levels of the kernel cache in one place (levels.h). */
#include "levels.h"

#include "nvrtc.h"

lajit_status lj_kernel_fetch(lj_env *env, lj_lua *L, lj_family *f, lj_cache *cache,
                             lj_bundle *bundle, const lj_device_info *dev, const lj_problem *p,
                             const lj_config *cfg, const void **image, const char **source)
{
    lj_kernel_job job;
    lajit_status st = lj_kernel_prepare_ex(L, f, cfg, p, dev, 0, 0, &job);
    if (st != LAJIT_OK)
        return st;
    const int have_nvrtc = job.nvrtc_major >= 0;
    int found = 0;
    size_t size;
    char cfgtext[256];
    lj_config_format(cfg, cfgtext, sizeof cfgtext);
    *image = NULL;
    if (have_nvrtc) {
        lj_cache_entry e;
        if ((st = lj_cache_get(cache, job.key, 0, &e, &found)) != LAJIT_OK)
            goto done;
        if (found) {
            *image = e.image;
            *source = e.from_disk ? "disk cache" : "memory";
            goto done;
        }
    }
    if (bundle) {
        st = lj_bundle_find(bundle, job.source_key, dev->arch, 0, image, &size, &found);
        if (st != LAJIT_OK || found) {
            *source = "bundle";
            goto done;
        }
        *image = NULL;
        if (have_nvrtc) {
            lj_log(env, LAJIT_LOG_INFO,
                   "bundle %s has no %s kernel of %s [%s]: compiling with NVRTC",
                   lj_bundle_path(bundle), dev->arch, lj_family_name(f), cfgtext);
        } else {
            char bucket[256], arch[16];
            if ((st = lj_family_key(f, p, bucket, sizeof bucket)) != LAJIT_OK)
                goto done;
            st = lj_bundle_find_ptx(bundle, lj_family_name(f), bucket, cfgtext, dev->cc, image,
                                    &size, arch, &found);
            if (st != LAJIT_OK)
                goto done;
            if (found) {
                lj_log(env, LAJIT_LOG_WARN,
                       "bundle %s has no %s kernel of %s [%s] and NVRTC is not available: loading "
                       "its %s PTX (the driver compiles it)",
                       lj_bundle_path(bundle), dev->arch, lj_family_name(f), cfgtext, arch);
                *source = "bundle PTX";
                goto done;
            }
            int major, minor;
            st = lj_nvrtc_version(env, &major, &minor);
            lj_error_prefix(
                env, "bundle %s has no %s kernel of %s [%s] for %s, and no PTX to fall back on",
                lj_bundle_path(bundle), dev->arch, lj_family_name(f), cfgtext, bucket);
            st = st != LAJIT_OK ? st : LAJIT_ERR_INTERNAL;
            goto done;
        }
    }
    if (!have_nvrtc) {
        int major, minor; /* the compiler's own message, recorded again */
        st = lj_nvrtc_version(env, &major, &minor);
        st = st != LAJIT_OK ? st
                            : lj_error(env, LAJIT_ERR_INTERNAL, "NVRTC came back during a build");
        goto done;
    }
    lj_compiled c;
    if ((st = lj_kernel_compile(env, &job, &c)) != LAJIT_OK) {
        lj_error_prefix(env, "%s [%s] for %s", lj_family_name(f), cfgtext, dev->arch);
        goto done;
    }
    st = lj_cache_put(cache, job.key, 0, &c);
    lj_compiled_free(env, &c);
    lj_cache_entry e;
    if (st == LAJIT_OK && (st = lj_cache_get(cache, job.key, 0, &e, &found)) == LAJIT_OK) {
        if (!found)
            st = lj_error(env, LAJIT_ERR_INTERNAL, "a kernel just stored is not in the cache");
        *image = e.image;
        *source = "compiled";
    }
done:
    lj_kernel_job_free(L, &job);
    return st;
}
