-- A family whose kernel is another family's template (toy/toy.cu), named in `uses` so that the
-- template text it is tuned under covers that folder too.
return {
    name = "usestoy", op = "fwd", uses = { "toy" },
    params = { X = { 1 } }, problems = { { D = 16 } },
    valid = function() return true end, default = function() return { X = 1 } end,
    key = function() return "k" end,
    launch = function() return { grid = { 1, 1, 1 }, block = { 32, 1, 1 }, smem = 0, entry = "k" } end,
    source = function() return { template = "toy/toy.cu" } end,
}
