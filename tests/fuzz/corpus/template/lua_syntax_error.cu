//% if then
x
//% end
