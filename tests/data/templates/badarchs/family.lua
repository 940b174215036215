-- A broken spec: an arch name the library does not know in its `archs` list.
return {
    name = "badarchs", op = "fwd", archs = { "sm_90a", "sm_91" },
    params = { X = { 1 } }, problems = { { D = 16 } },
    valid = function() return true end, default = function() return { X = 1 } end,
    key = function() return "k" end,
    launch = function() return { grid = { 1, 1, 1 }, block = { 32, 1, 1 }, smem = 0, entry = "k" } end,
    source = function() return { template = "badarchs/none.cu" } end,
}
