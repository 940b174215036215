//% local ok, e = pcall(error, "inner")
${tostring(ok)} ${e}
//% pcall(string.rep, "x", -1)
