//% local acc = {}
//% for i = 1, 4 do
//%   for j = i, 4 do
    a[${i}][${j}] = ${i * j};
//%     acc[#acc + 1] = i + j
//%   end
//% end
//% if #acc > 5 and problem.decay then
int n = ${#acc};
//% elseif device.cc >= 90 then
int m = 0;
//% else
int k = 1;
//% end
