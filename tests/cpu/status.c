/* status.c — status values are pinned and every one has a text. */
#include "test.h"

LJ_TEST(pinned_values)
{
    ASSERT_EQ(LAJIT_OK, 0);
    ASSERT_EQ(LAJIT_ERR_INVALID_ARGUMENT, 1);
    ASSERT_EQ(LAJIT_ERR_NO_DRIVER, 3);
    ASSERT_EQ(LAJIT_ERR_INTERNAL, 17);
    ASSERT_EQ(LAJIT_ERR_DEVICE_OUT_OF_MEMORY, 18);
    ASSERT_EQ(LAJIT_ERR_DEVICE_FAULT, 19);
    ASSERT_EQ(LAJIT_ERR_NO_NCCL, 20);
    ASSERT_EQ(LAJIT_ERR_NCCL, 21);
    for (int s = 0; s <= LAJIT_ERR_NCCL; s++)
        ASSERT_TRUE(strcmp(lajit_status_string((lajit_status)s), "unknown status") != 0);
    ASSERT_STREQ(lajit_status_string((lajit_status)999), "unknown status");
    ASSERT_EQ(lajit_version(), LAJIT_VERSION_NUMBER);
}
