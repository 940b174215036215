-- A broken spec: the right name, but no launch function.
return {
    name = "badspec", op = "fwd", params = { X = { 1 } }, problems = { { D = 16 } },
    valid = function() return true end, default = function() return { X = 1 } end,
    key = function() return "k" end,
    source = function() return { template = "badspec/none.cu" } end,
}
