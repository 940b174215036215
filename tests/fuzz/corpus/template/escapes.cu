//% io.open("/etc/passwd")
${os.getenv("HOME")}
//% require("os")
//% load("return 1")()
