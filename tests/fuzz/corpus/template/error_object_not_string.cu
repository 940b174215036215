//% error({})
//% error(nil)
