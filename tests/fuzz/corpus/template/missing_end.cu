//% for i = 1, 3 do
int a;
