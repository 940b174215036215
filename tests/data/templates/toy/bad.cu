// line 1
// line 2
int x = ${undefined_value};
