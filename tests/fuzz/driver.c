/* driver.c — a plain main() for the fuzz harnesses, used where libFuzzer is absent and by CTest
 * in every build: replays each file named on the command line, and every file of each directory
 * named (in name order, dot files skipped), through LLVMFuzzerTestOneInput. Each input is copied
 * into a buffer of exactly its size, so AddressSanitizer sees a read past its end. A crash or a
 * broken invariant aborts with the file's name printed first; otherwise prints a count. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot read %s\n", path);
        return 0;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc(n > 0 ? (size_t)n : 1);
    if (!data || n < 0 || (n > 0 && fread(data, 1, (size_t)n, f) != (size_t)n)) {
        fprintf(stderr, "cannot read %s\n", path);
        fclose(f);
        free(data);
        return 0;
    }
    fclose(f);
    fprintf(stderr, "replaying %s\n", path);
    LLVMFuzzerTestOneInput(data, (size_t)n);
    free(data);
    return 1;
}

static int replay_dir(const char *path, int *count)
{
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    if (n < 0) {
        fprintf(stderr, "cannot list %s\n", path);
        return 0;
    }
    int ok = 1;
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.' && ok) {
            char file[4096];
            snprintf(file, sizeof file, "%s/%s", path, names[i]->d_name);
            struct stat st;
            if (stat(file, &st) == 0 && S_ISREG(st.st_mode)) {
                ok = replay_file(file);
                *count += ok;
            }
        }
        free(names[i]);
    }
    free(names);
    return ok;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 2;
    }
    int count = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "no such file or directory: %s\n", argv[i]);
            return 2;
        }
        int ok = S_ISDIR(st.st_mode) ? replay_dir(argv[i], &count) : replay_file(argv[i]);
        if (!ok)
            return 2;
        count += !S_ISDIR(st.st_mode);
    }
    if (count == 0) {
        fprintf(stderr, "no inputs found\n");
        return 2;
    }
    printf("replayed %d inputs\n", count);
    return 0;
}
