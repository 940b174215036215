//% error("stop here")
