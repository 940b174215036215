/* cache.c — compiled kernels by key: an in-memory map in front of a disk directory (see
 * cache.h).
 *
 * Memory: an open-addressing hash table keyed by (key, ptx). Keys are already uniform hashes,
 * so the low bits index the table directly. Images are separate blocks that never move or get
 * replaced, so the pointers lj_cache_get hands out stay valid until lj_cache_close.
 *
 * Disk: one file per entry, "<32 hex>.cubin" or ".ptx", holding a fixed 96-byte header written
 * field by field in little-endian order (never a struct dump, so the format does not depend on
 * the compiler's padding or the host's byte order) and then the payload:
 *   0  magic "LAJITKC1"            8  u32 header version (1)     12 u32 reserved (0)
 *   16 lajit version, 16 bytes NUL-padded
 *   32 u64 key hi                  40 u64 key lo
 *   48 u64 payload size            56 u64 XXH3-64 of the payload
 *   64 i32 regs, spill stores, spill loads, stack bytes, static smem
 *   84 12 reserved bytes (0)
 * A cache directory is shared by every process of the user, so entries are published with
 * rename(2) from a private temporary file: a reader sees a whole entry or none. Whatever is on
 * disk is still treated as untrusted input: an entry or directory that someone else could have
 * written is refused (loading it would run their code on the GPU), and an entry that fails any
 * check is removed so the next compile rebuilds it.
 *
 * Thread safety: an lj_cache is used by one thread at a time, like the lj_env it logs to.
 * Different lj_cache objects (in one process or many) may share a directory. */
#include "cache.h"
#include "fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HEADER_SIZE       96
#define HEADER_VERSION    1u
#define MAX_PAYLOAD       ((uint64_t)1 << 30) /* a kernel image is never near 1 GiB: refuse junk */
#define STALE_TMP_SECONDS 600                 /* a temp file this old has no live writer */

static const char k_magic[8] = {'L', 'A', 'J', 'I', 'T', 'K', 'C', '1'};

typedef struct slot {
    lj_key key;
    int ptx;
    int used;
    void *image;
    size_t size;
    int regs, spill_stores, spill_loads, stack_bytes, smem_static;
} slot;

typedef enum dir_state {
    DIR_UNKNOWN = 0, /* not opened yet (maybe absent: created on first write) */
    DIR_OPEN,        /* dir_fd is valid and passed the ownership checks */
    DIR_REFUSED      /* not ours or writable by others: disk caching is off */
} dir_state;

struct lj_cache {
    lj_env *env;
    char *dir;
    dir_state state;
    int dir_fd;
    slot *slots;
    size_t cap, count; /* cap is a power of two (or 0) */
};

/* ---- Little-endian encoding --------------------------------------------------------------- */

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

typedef struct entry_header {
    uint32_t version;
    char lajit_version[17];
    lj_key key;
    uint64_t payload_size, checksum;
    int32_t res[5]; /* regs, spill stores, spill loads, stack, smem */
} entry_header;

static void encode_header(unsigned char *h, lj_key key, const void *payload, size_t size,
                          const int32_t res[5])
{
    memset(h, 0, HEADER_SIZE);
    memcpy(h, k_magic, 8);
    put_u32(h + 8, HEADER_VERSION);
    size_t vlen = strlen(LAJIT_VERSION_STRING);
    memcpy(h + 16, LAJIT_VERSION_STRING, vlen < 16 ? vlen : 16);
    put_u64(h + 32, key.hi);
    put_u64(h + 40, key.lo);
    put_u64(h + 48, (uint64_t)size);
    put_u64(h + 56, lj_hash64(payload, size));
    for (int i = 0; i < 5; i++)
        put_u32(h + 64 + 4 * i, (uint32_t)res[i]);
}

/* Checks what can be checked from the header and the file size alone. NULL when fine, else the
 * reason. */
static const char *decode_header(const unsigned char *h, uint64_t file_size, entry_header *out)
{
    if (file_size < HEADER_SIZE)
        return "truncated header";
    if (memcmp(h, k_magic, 8) != 0)
        return "bad magic";
    out->version = get_u32(h + 8);
    if (out->version != HEADER_VERSION)
        return "unknown header version";
    memcpy(out->lajit_version, h + 16, 16);
    out->lajit_version[16] = 0;
    out->key.hi = get_u64(h + 32);
    out->key.lo = get_u64(h + 40);
    out->payload_size = get_u64(h + 48);
    out->checksum = get_u64(h + 56);
    for (int i = 0; i < 5; i++)
        out->res[i] = (int32_t)get_u32(h + 64 + 4 * i);
    if (out->payload_size > MAX_PAYLOAD)
        return "payload size out of range";
    if (file_size < HEADER_SIZE + out->payload_size)
        return "truncated payload";
    if (file_size > HEADER_SIZE + out->payload_size)
        return "size mismatch (trailing bytes)";
    return NULL;
}

/* ---- Files ---------------------------------------------------------------------------------- */

static const char *suffix(int ptx)
{
    return ptx ? ".ptx" : ".cubin";
}

/* Result of reading one entry file. */
typedef enum read_result {
    READ_OK,
    READ_ABSENT,  /* no such file */
    READ_REFUSED, /* exists but may not be trusted: left alone */
    READ_BAD,     /* corrupt or foreign: the caller may remove it */
    READ_ERROR    /* I/O error or out of memory: nothing is known */
} read_result;

/* Opens and checks one entry file of the directory dir_fd. With want_payload the payload is
 * read into *payload (owned, lj_malloc) and, with verify, checked against the checksum.
 * *reason says why on anything but READ_OK and READ_ABSENT. */
static read_result read_entry(lj_env *env, int dir_fd, const char *fname, int want_payload,
                              int verify, entry_header *hdr, void **payload, uint64_t *file_size,
                              const char **reason)
{
    *reason = NULL;
    int fd = lj_fs_openat(env, dir_fd, fname, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0) {
        if (errno == ENOENT)
            return READ_ABSENT;
        *reason = errno == ELOOP ? "a symbolic link" : strerror(errno);
        return errno == ELOOP ? READ_REFUSED : READ_ERROR;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *reason = strerror(errno);
        close(fd);
        return READ_ERROR;
    }
    *file_size = (uint64_t)st.st_size;
    if ((*reason = lj_fs_ownership_problem(&st, 0)) != NULL) {
        close(fd);
        return READ_REFUSED;
    }
    unsigned char h[HEADER_SIZE];
    size_t head = st.st_size < HEADER_SIZE ? (size_t)st.st_size : HEADER_SIZE;
    if (!lj_fs_read_all(env, fd, h, head)) {
        *reason = "read failed";
        close(fd);
        return READ_ERROR;
    }
    if ((*reason = decode_header(h, (uint64_t)st.st_size, hdr)) != NULL) {
        close(fd);
        return READ_BAD;
    }
    if (!want_payload) {
        close(fd);
        return READ_OK;
    }
    /* One spare NUL byte keeps a PTX payload usable as a string. */
    unsigned char *data = lj_malloc(env, (size_t)hdr->payload_size + 1);
    if (!data) {
        *reason = "out of memory";
        close(fd);
        return READ_ERROR;
    }
    data[hdr->payload_size] = 0;
    int ok = lj_fs_read_all(env, fd, data, (size_t)hdr->payload_size);
    int err = errno;
    close(fd);
    if (!ok) {
        lj_free(env, data);
        /* A read error says nothing about the entry (leave it); an early end means the file is
         * shorter than its header claims (it shrank since fstat): bad. */
        *reason = err ? strerror(err) : "truncated payload";
        return err ? READ_ERROR : READ_BAD;
    }
    if (verify && lj_hash64(data, (size_t)hdr->payload_size) != hdr->checksum) {
        *reason = "checksum mismatch";
        lj_free(env, data);
        return READ_BAD;
    }
    *payload = data;
    return READ_OK;
}

/* Opens and checks the cache directory once. create: make it when absent (on writes). Returns 1
 * when dir_fd is usable. */
static int ensure_dir(lj_cache *c, int create)
{
    if (!c->dir || c->state == DIR_REFUSED)
        return 0;
    if (c->state == DIR_OPEN)
        return 1;
    int fd = lj_fs_open(c->env, c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0 && errno == ENOENT && create) {
        if (!lj_fs_mkdir_p(c->env, c->dir)) {
            lj_log(c->env, LAJIT_LOG_WARN, "cache: cannot create directory %s: %s", c->dir,
                   strerror(errno));
            return 0;
        }
        fd = lj_fs_open(c->env, c->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    }
    if (fd < 0) {
        /* Absent (on a read) is normal; anything else is worth a word. Either way try again
         * later: the directory may appear. */
        if (errno != ENOENT)
            lj_log(c->env, LAJIT_LOG_WARN, "cache: cannot open directory %s: %s", c->dir,
                   strerror(errno));
        return 0;
    }
    struct stat st;
    memset(&st, 0, sizeof st);
    const char *problem = fstat(fd, &st) != 0 ? strerror(errno) : lj_fs_ownership_problem(&st, 1);
    if (problem) {
        lj_log(c->env, LAJIT_LOG_WARN,
               "cache: directory %s refused (%s, mode %03o); disk cache disabled", c->dir, problem,
               (unsigned)(st.st_mode & 0777));
        close(fd);
        c->state = DIR_REFUSED;
        return 0;
    }
    c->dir_fd = fd;
    c->state = DIR_OPEN;
    return 1;
}

/* ---- Memory map ----------------------------------------------------------------------------- */

static size_t slot_index(lj_key key, int ptx, size_t cap)
{
    return (size_t)(key.lo ^ (uint64_t)ptx) & (cap - 1);
}

static slot *find_slot(const lj_cache *c, lj_key key, int ptx)
{
    if (c->cap == 0)
        return NULL;
    for (size_t i = slot_index(key, ptx, c->cap);; i = (i + 1) & (c->cap - 1)) {
        slot *s = &c->slots[i];
        if (!s->used)
            return NULL;
        if (s->ptx == ptx && lj_key_equal(s->key, key))
            return s;
    }
}

/* Keeps the table at most half full so probes stay short. 0 on allocation failure. */
static int reserve(lj_cache *c)
{
    if ((c->count + 1) * 2 <= c->cap)
        return 1;
    size_t ncap = c->cap ? c->cap * 2 : 16;
    slot *ns = lj_calloc(c->env, ncap, sizeof *ns);
    if (!ns)
        return 0;
    for (size_t i = 0; i < c->cap; i++) {
        if (!c->slots[i].used)
            continue;
        size_t j = slot_index(c->slots[i].key, c->slots[i].ptx, ncap);
        while (ns[j].used)
            j = (j + 1) & (ncap - 1);
        ns[j] = c->slots[i];
    }
    lj_free(c->env, c->slots);
    c->slots = ns;
    c->cap = ncap;
    return 1;
}

/* Takes ownership of image. The caller checked that the key is absent and reserved room. */
static slot *insert(lj_cache *c, lj_key key, int ptx, void *image, size_t size,
                    const int32_t res[5])
{
    size_t i = slot_index(key, ptx, c->cap);
    while (c->slots[i].used)
        i = (i + 1) & (c->cap - 1);
    slot *s = &c->slots[i];
    s->key = key;
    s->ptx = ptx;
    s->used = 1;
    s->image = image;
    s->size = size;
    s->regs = res[0];
    s->spill_stores = res[1];
    s->spill_loads = res[2];
    s->stack_bytes = res[3];
    s->smem_static = res[4];
    c->count++;
    return s;
}

static void fill_entry(const slot *s, int from_disk, lj_cache_entry *out)
{
    out->image = s->image;
    out->size = s->size;
    out->regs = s->regs;
    out->spill_stores = s->spill_stores;
    out->spill_loads = s->spill_loads;
    out->stack_bytes = s->stack_bytes;
    out->smem_static = s->smem_static;
    out->from_disk = from_disk;
}

/* ---- Public --------------------------------------------------------------------------------- */

lajit_status lj_cache_open(lj_env *env, const char *dir, lj_cache **out)
{
    if (!out || (dir && !*dir))
        return lj_error(env, LAJIT_ERR_INVALID_ARGUMENT, "cache: empty directory name");
    lj_cache *c = lj_calloc(env, 1, sizeof *c);
    if (!c)
        return lj_oom(env);
    c->env = env;
    c->dir_fd = -1;
    if (dir && !(c->dir = lj_strdup(env, dir))) {
        lj_free(env, c);
        return lj_oom(env);
    }
    *out = c;
    return LAJIT_OK;
}

void lj_cache_close(lj_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i].used)
            lj_free(c->env, c->slots[i].image);
    lj_free(c->env, c->slots);
    if (c->dir_fd >= 0)
        close(c->dir_fd);
    lj_free(c->env, c->dir);
    lj_free(c->env, c);
}

const char *lj_cache_dir(const lj_cache *c)
{
    return c ? c->dir : NULL;
}

lajit_status lj_cache_default_dir(lj_env *env, char **dir)
{
    const char *v = getenv("LAJIT_CACHE_DIR");
    char *d = NULL;
    if (v && *v) {
        d = lj_strdup(env, v);
    } else {
        lj_buf b;
        lj_buf_init(&b, env);
        const char *xdg = getenv("XDG_CACHE_HOME");
        const char *home = getenv("HOME");
        /* The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored. */
        if (xdg && xdg[0] == '/') {
            lj_buf_printf(&b, "%s/lajit", xdg);
        } else if (home && *home) {
            lj_buf_printf(&b, "%s/.cache/lajit", home);
        } else {
            struct passwd pw, *res = NULL;
            char pwbuf[4096];
            if (getpwuid_r(geteuid(), &pw, pwbuf, sizeof pwbuf, &res) != 0 || !res ||
                !res->pw_dir || !*res->pw_dir) {
                lj_buf_free(&b);
                return lj_error(env, LAJIT_ERR_CACHE,
                                "no cache directory: LAJIT_CACHE_DIR, XDG_CACHE_HOME and HOME "
                                "are unset and the user has no home directory");
            }
            lj_buf_printf(&b, "%s/.cache/lajit", res->pw_dir);
        }
        d = lj_buf_take(&b);
    }
    if (!d)
        return lj_oom(env);
    *dir = d;
    return LAJIT_OK;
}

lajit_status lj_cache_get(lj_cache *c, lj_key key, int ptx, lj_cache_entry *out, int *found)
{
    ptx = ptx != 0;
    slot *s = find_slot(c, key, ptx);
    if (s) {
        fill_entry(s, 0, out);
        *found = 1;
        return LAJIT_OK;
    }
    *found = 0;
    if (!ensure_dir(c, 0))
        return LAJIT_OK;

    char fname[48];
    lj_key_hex(key, fname);
    strcat(fname, suffix(ptx));
    entry_header hdr;
    void *payload = NULL;
    uint64_t fsize = 0;
    const char *reason;
    read_result r = read_entry(c->env, c->dir_fd, fname, 1, 1, &hdr, &payload, &fsize, &reason);
    if (r == READ_OK && !lj_key_equal(hdr.key, key)) {
        /* A valid entry under the wrong name: copied or renamed by hand; never load it. */
        lj_free(c->env, payload);
        r = READ_BAD;
        reason = "key in header does not match the file name";
    }
    switch (r) {
        case READ_ABSENT: return LAJIT_OK;
        case READ_REFUSED:
            lj_log(c->env, LAJIT_LOG_WARN, "cache: entry %s/%s refused (%s); not loaded", c->dir,
                   fname, reason);
            return LAJIT_OK;
        case READ_BAD:
            lj_log(c->env, LAJIT_LOG_WARN, "cache: entry %s/%s is bad (%s); removed, will rebuild",
                   c->dir, fname, reason);
            unlinkat(c->dir_fd, fname, 0);
            return LAJIT_OK;
        case READ_ERROR:
            if (reason && strcmp(reason, "out of memory") == 0)
                return lj_oom(c->env);
            lj_log(c->env, LAJIT_LOG_WARN, "cache: cannot read entry %s/%s (%s)", c->dir, fname,
                   reason ? reason : "unknown error");
            return LAJIT_OK;
        case READ_OK: break;
    }
    if (!reserve(c)) {
        lj_free(c->env, payload);
        return lj_oom(c->env);
    }
    s = insert(c, key, ptx, payload, (size_t)hdr.payload_size, hdr.res);
    fill_entry(s, 1, out);
    *found = 1;
    return LAJIT_OK;
}

/* Writes one entry through a private temporary file and rename(2). Failures are logged. */
static void write_entry(lj_cache *c, lj_key key, int ptx, const void *image, size_t size,
                        const int32_t res[5])
{
    if (!ensure_dir(c, 1))
        return;
    char hex[33], fname[48], prefix[40];
    lj_key_hex(key, hex);
    snprintf(fname, sizeof fname, "%s%s", hex, suffix(ptx));
    snprintf(prefix, sizeof prefix, "%s.tmp.", hex);
    char *tmp;
    int fd = lj_fs_create_tmp(c->env, c->dir_fd, prefix, '.', O_WRONLY, &tmp);
    if (fd < 0) {
        lj_log(c->env, LAJIT_LOG_WARN, "cache: cannot create a temporary file in %s: %s", c->dir,
               strerror(errno));
        return;
    }
    unsigned char h[HEADER_SIZE];
    encode_header(h, key, image, size, res);
    int ok = lj_fs_write_all(c->env, fd, h, sizeof h) && lj_fs_write_all(c->env, fd, image, size);
    int err = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    if (ok && lj_fs_renameat(c->env, c->dir_fd, tmp, c->dir_fd, fname) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        unlinkat(c->dir_fd, tmp, 0);
        lj_log(c->env, LAJIT_LOG_WARN, "cache: cannot write entry %s/%s: %s", c->dir, fname,
               strerror(err));
    }
    lj_free(c->env, tmp);
}

lajit_status lj_cache_put(lj_cache *c, lj_key key, int ptx, const lj_compiled *compiled)
{
    ptx = ptx != 0;
    if (!compiled || (!compiled->image && compiled->image_size))
        return lj_error(c->env, LAJIT_ERR_INVALID_ARGUMENT, "cache: no image to store");
    if ((uint64_t)compiled->image_size > MAX_PAYLOAD)
        return lj_error(c->env, LAJIT_ERR_INVALID_ARGUMENT, "cache: image of %zu bytes too large",
                        compiled->image_size);
    const int32_t res[5] = {compiled->regs, compiled->spill_stores, compiled->spill_loads,
                            compiled->stack_bytes, compiled->smem_static};
    /* An image already in memory stays: pointers to it may have been handed out. */
    if (!find_slot(c, key, ptx)) {
        if (!reserve(c))
            return lj_oom(c->env);
        void *copy = lj_malloc(c->env, compiled->image_size + 1);
        if (!copy)
            return lj_oom(c->env);
        if (compiled->image_size)
            memcpy(copy, compiled->image, compiled->image_size);
        ((char *)copy)[compiled->image_size] = 0;
        insert(c, key, ptx, copy, compiled->image_size, res);
    }
    write_entry(c, key, ptx, compiled->image ? compiled->image : "", compiled->image_size, res);
    return LAJIT_OK;
}

/* ---- Maintenance ---------------------------------------------------------------------------- */

/* "<32 hex>.cubin" / "<32 hex>.ptx": 1; "<32 hex>.tmp.<pid>.<rand>": 2; anything else 0. */
static int classify(const char *name, long *tmp_pid)
{
    lj_key k;
    char hex[33];
    if (strlen(name) < 33)
        return 0;
    memcpy(hex, name, 32);
    hex[32] = 0;
    if (!lj_key_parse(hex, &k))
        return 0;
    const char *rest = name + 32;
    if (strcmp(rest, ".cubin") == 0 || strcmp(rest, ".ptx") == 0)
        return 1;
    if (strncmp(rest, ".tmp.", 5) == 0) {
        char *end;
        *tmp_pid = strtol(rest + 5, &end, 10);
        return *end == '.' ? 2 : 0;
    }
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Opens dir (refusing one that is not safely ours) and lists its names, sorted, so the CLI's
 * output is stable. *dir_fd is -1 and *n 0 when the directory does not exist. */
static lajit_status list_dir(lj_env *env, const char *dir, int *dir_fd, char ***names, size_t *n)
{
    *dir_fd = -1;
    *names = NULL;
    *n = 0;
    int fd = lj_fs_open(env, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) {
        if (errno == ENOENT)
            return LAJIT_OK;
        return lj_error(env, LAJIT_ERR_IO, "cache: cannot open directory %s: %s", dir,
                        strerror(errno));
    }
    struct stat st;
    memset(&st, 0, sizeof st);
    const char *problem = fstat(fd, &st) != 0 ? strerror(errno) : lj_fs_ownership_problem(&st, 1);
    if (problem) {
        close(fd);
        return lj_error(env, LAJIT_ERR_CACHE, "cache: directory %s refused (%s, mode %03o)", dir,
                        problem, (unsigned)(st.st_mode & 0777));
    }
    int fd2 = dup(fd);
    DIR *d = fd2 >= 0 ? fdopendir(fd2) : NULL;
    if (!d) {
        if (fd2 >= 0)
            close(fd2);
        close(fd);
        return lj_error(env, LAJIT_ERR_IO, "cache: cannot list %s: %s", dir, strerror(errno));
    }
    char **list = NULL;
    size_t count = 0, cap = 0;
    lajit_status s = LAJIT_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid;
        if (!classify(e->d_name, &pid))
            continue;
        if (count == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            char **nl = lj_realloc(env, list, ncap * sizeof *nl);
            if (!nl) {
                s = lj_oom(env);
                break;
            }
            list = nl;
            cap = ncap;
        }
        if (!(list[count] = lj_strdup(env, e->d_name))) {
            s = lj_oom(env);
            break;
        }
        count++;
    }
    closedir(d);
    if (s != LAJIT_OK) {
        for (size_t i = 0; i < count; i++)
            lj_free(env, list[i]);
        lj_free(env, list);
        close(fd);
        return s;
    }
    if (count)
        qsort(list, count, sizeof *list, cmp_names);
    *dir_fd = fd;
    *names = list;
    *n = count;
    return LAJIT_OK;
}

static void free_list(lj_env *env, char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        lj_free(env, names[i]);
    lj_free(env, names);
}

lajit_status lj_cache_scan(lj_env *env, const char *dir, int verify, lj_cache_visit_fn fn,
                           void *user)
{
    int fd;
    char **names;
    size_t n;
    lajit_status s = list_dir(env, dir, &fd, &names, &n);
    if (s != LAJIT_OK)
        return s;
    size_t path_cap = strlen(dir) + 64; /* entry names are at most 32 hex + ".cubin" */
    char *path = lj_malloc(env, path_cap);
    if (!path) {
        free_list(env, names, n);
        if (fd >= 0)
            close(fd);
        return lj_oom(env);
    }
    for (size_t i = 0; i < n; i++) {
        long pid;
        if (classify(names[i], &pid) != 1)
            continue;
        entry_header hdr;
        void *payload = NULL;
        uint64_t size = 0;
        const char *reason = NULL;
        read_result r =
            read_entry(env, fd, names[i], verify, verify, &hdr, &payload, &size, &reason);
        lj_free(env, payload);
        if (r == READ_ABSENT)
            continue; /* removed since the listing */
        if (r == READ_ERROR && reason && strcmp(reason, "out of memory") == 0) {
            s = lj_oom(env);
            break;
        }
        if (r == READ_OK) {
            char hex[33];
            lj_key name_key;
            memcpy(hex, names[i], 32);
            hex[32] = 0;
            if (lj_key_parse(hex, &name_key) && !lj_key_equal(name_key, hdr.key)) {
                r = READ_BAD;
                reason = "key in header does not match the file name";
            }
        }
        snprintf(path, path_cap, "%s/%s", dir, names[i]);
        if (fn)
            fn(user, path, (size_t)size, r == READ_OK, r == READ_OK ? NULL : reason);
    }
    lj_free(env, path);
    free_list(env, names, n);
    if (fd >= 0)
        close(fd);
    return s;
}

lajit_status lj_cache_clear(lj_env *env, const char *dir, int *removed)
{
    int fd;
    char **names;
    size_t n;
    lajit_status s = list_dir(env, dir, &fd, &names, &n);
    if (s != LAJIT_OK)
        return s;
    int count = 0;
    time_t now = time(NULL);
    for (size_t i = 0; i < n; i++) {
        long pid = 0;
        int kind = classify(names[i], &pid);
        if (kind == 2) {
            /* A temp file is stale when its writer is gone or it has sat there for long (the
             * pid may belong to another pid namespace sharing this directory). */
            struct stat st;
            int alive = pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
            int old = fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                      now - st.st_mtime > STALE_TMP_SECONDS;
            if (alive && !old)
                continue;
        }
        if (unlinkat(fd, names[i], 0) == 0)
            count++;
        else if (errno != ENOENT)
            lj_log(env, LAJIT_LOG_WARN, "cache: cannot remove %s/%s: %s", dir, names[i],
                   strerror(errno));
    }
    free_list(env, names, n);
    if (fd >= 0)
        close(fd);
    if (removed)
        *removed = count;
    return LAJIT_OK;
}
