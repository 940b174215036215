/* lajit.c — the `lajit` command (placeholder until the CLI lands). */
#include <stdio.h>

#include "lajit.h"

int main(void)
{
    printf("lajit %s\n", lajit_version_string());
    return 0;
}
