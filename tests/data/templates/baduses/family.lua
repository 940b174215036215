-- A broken spec: `uses` names a path, not a template folder.
return {
    name = "baduses", op = "fwd", uses = { "toy", "../toy" },
    params = { X = { 1 } }, problems = { { D = 16 } },
    valid = function() return true end, default = function() return { X = 1 } end,
    key = function() return "k" end,
    launch = function() return { grid = { 1, 1, 1 }, block = { 32, 1, 1 }, smem = 0, entry = "k" } end,
    source = function() return { template = "toy/toy.cu" } end,
}
