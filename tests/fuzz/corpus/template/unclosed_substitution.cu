int x = ${D +
int y;
