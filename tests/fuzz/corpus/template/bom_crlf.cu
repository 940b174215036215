// bom and crlf
int a = ${WARPS};
//% if true then
int b;
//% end
