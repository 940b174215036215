//% local t = {} for i = 1, 2000 do t[i] = i * i end
int n = ${#t};
${table.concat(t, ",", 1, 10)}
