-- wgmma_products.lua — the CUDA text of the wgmma products a Hopper template uses, one set per
-- output width n (m64nNk16, fp32 accumulators, f16 or bf16 operands):
--   wg_ss<n><TA, TB>(d, da, db, acc)   A and B from shared memory: d (+)= A·B (acc: accumulate)
--   wg_ss<n>_z<TA, TB>(d, da, db)      the same with d overwritten (write-only operands)
--   wg_rs<n><TB>(d, a, db, acc)        A from registers (four 32-bit registers per thread)
-- TA/TB: 1 = MN-major (transposed). Their asm operand lists depend on n, so they are generated,
-- here once, for every template that needs them (la_fwd_sm90/fwd.cu and the families built on
-- it): `${wgmma.products({ BLOCK, TILE_V }, "bf16")}` after
-- `//% local wgmma = import("common/wgmma_products.lua")`. Repeated widths are emitted once.

local M = {}

local function operands(n, fmt)
    local list = {}
    for i = 0, n - 1 do list[#list + 1] = string.format(fmt, i) end
    return table.concat(list, ", ")
end

local function one(n, ty)
    local regs = n // 2
    local d = operands(regs, "%%%d")
    local rw, w = operands(regs, '"+f"(d[%d])'), operands(regs, '"=f"(d[%d])')
    local mma = string.format("wgmma.mma_async.sync.aligned.m64n%dk16.f32.%s.%s", n, ty, ty)
    return table.concat({
        string.format("// m64n%dk16, A and B from shared memory: d (+)= A·B. TA/TB: 1 = MN-major (transposed).", n),
        "template <int TA, int TB>",
        string.format("__device__ __forceinline__ void wg_ss%d(float (&d)[%d], unsigned long long da, unsigned long long db, int acc)", n, regs),
        "{",
        string.format('    asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n"', regs + 2),
        string.format('                 "%s {%s}, "', mma, d),
        string.format('                 "%%%d, %%%d, p, 1, 1, %%%d, %%%d;\\n}\\n"', regs, regs + 1, regs + 3, regs + 4),
        "                 : " .. rw,
        '                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));',
        "}",
        "// The same with the accumulator overwritten (d = A·B): write-only operands, so the compiler never",
        "// has to give d a value before the product (a value it may take from other registers in flight).",
        "template <int TA, int TB>",
        string.format("__device__ __forceinline__ void wg_ss%d_z(float (&d)[%d], unsigned long long da, unsigned long long db)", n, regs),
        "{",
        '    asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, 0, 0;\\n"',
        string.format('                 "%s {%s}, "', mma, d),
        string.format('                 "%%%d, %%%d, p, 1, 1, %%%d, %%%d;\\n}\\n"', regs, regs + 1, regs + 2, regs + 3),
        "                 : " .. w,
        '                 : "l"(da), "l"(db), "n"(TA), "n"(TB));',
        "}",
        string.format("// m64n%dk16, A from registers (four 32-bit registers per thread), B from shared memory.", n),
        "template <int TB>",
        string.format("__device__ __forceinline__ void wg_rs%d(float (&d)[%d], const unsigned (&a)[4], unsigned long long db, int acc)", n, regs),
        "{",
        string.format('    asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %%%d, 0;\\n"', regs + 5),
        string.format('                 "%s {%s}, "', mma, d),
        string.format('                 "{%%%d, %%%d, %%%d, %%%d}, %%%d, p, 1, 1, %%%d;\\n}\\n"', regs, regs + 1, regs + 2, regs + 3, regs + 4, regs + 6),
        "                 : " .. rw,
        '                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));',
        "}",
    }, "\n")
end

-- The products for each distinct width of `widths` (m64 outputs of n columns), operand type ty
-- ("f16" or "bf16").
function M.products(widths, ty)
    assert(ty == "f16" or ty == "bf16", "wgmma_products: ty must be f16 or bf16")
    local out, seen = {}, {}
    for _, n in ipairs(widths) do
        assert(n % 8 == 0 and n >= 8 and n <= 256, "wgmma_products: n must be a multiple of 8 up to 256")
        if not seen[n] then
            seen[n] = true
            out[#out + 1] = one(n, ty)
        end
    end
    return table.concat(out, "\n")
end

return M
