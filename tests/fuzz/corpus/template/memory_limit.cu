//% local s = string.rep("x", 1 << 26)
${#s}
