-- A broken spec: `uses` names more folders than a family may use.
return {
    name = "manyuses", op = "fwd", uses = { "a", "b", "c", "d", "e", "f", "g" },
    params = { X = { 1 } }, problems = { { D = 16 } },
    valid = function() return true end, default = function() return { X = 1 } end,
    key = function() return "k" end,
    launch = function() return { grid = { 1, 1, 1 }, block = { 32, 1, 1 }, smem = 0, entry = "k" } end,
    source = function() return { template = "toy/toy.cu" } end,
}
