//% local function tile(n) return n // 2 end
//% local names = {"q", "k", "v"}
//% for _, nm in ipairs(names) do
float ${nm}_tile[${tile(BLOCK)}];
//% end
${string.format("%d-%s", 7, "x")} ${("ab"):upper()} ${table.concat({1,2,3}, ",")}
${math.max(1, 2)} ${math.floor(2.5)} ${tostring(nil)} ${select("#", 1, 2)}
