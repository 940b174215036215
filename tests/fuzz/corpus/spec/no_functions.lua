return { name = "fz", op = "custom", args = { { name = "x", dtype = "f32", shape = { "N" }, optional = true } } }
