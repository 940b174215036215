#!/usr/bin/env python3
"""report.py — merges one run's lajit rows (lajit_bench's JSON lines) and the peers' rows
(../shared/peers/peer_bench.py --out, or the JSON lines it and bench/peers_decode.py print) into
docs/bench/<gpu>.json, the report format of DESIGN.md, and writes <gpu>.md beside it with the
tables and <gpu>.png, <gpu>-decode.png with the plots (where matplotlib is present).

Usage: report.py --lajit lajit.jsonl [--peers peers.json ...] --gpu h200 --commit SHA \
                 [--meta meta.json] [--out docs/bench] [--run NAME --join OLD.json]
--peers may be given several times (peer_bench.py's --out, peer_bench.py's or peers_decode.py's
printed JSON lines: every file of one device call) or not at all. A peer row with `error` (a
failure, or a timeout that bench/run_device.sh recorded) yields no report row; the tables say
what is missing instead.
--run tags this call's rows; --join carries over the rows of OLD.json whose `run` differs (an
earlier device call, e.g. the decode call beside a prefill call), each still compared only with
rows of its own call.
meta.json (optional) holds {"device", "cc", "driver"} as the driver reports them.
Every row must come from the same run on the same GPU; this script does not mix runs.

Row sets: prefill rows at B = 4, H = 32 are the grid (tables and plot by D and N); fwd and
fwdbwd rows of any other B, H are the long-sequence rows (DESIGN.md: their own B and H, beside
FLA rows of the same shape), each given `fla_ms` and `vs_fla` (lajit / FLA) where FLA measured
that shape in the same call. Decode rows: one table per state pool dtype (`state_dtype`) with its
own in-place ceiling; rows with `pdl` (0 or 1) get a column each where both are present."""
import argparse, datetime, json, os

p = argparse.ArgumentParser()
p.add_argument("--lajit", required=True)
p.add_argument("--peers", action="append", default=[])
p.add_argument("--gpu", required=True)
p.add_argument("--commit", default="unknown")
p.add_argument("--meta", default=None)
p.add_argument("--out", default="docs/bench")
p.add_argument("--run", default=None)
p.add_argument("--join", default=None)
a = p.parse_args()


def read_rows(path):
    """A JSON object with `rows` (and maybe `device`), or JSON lines (any other line skipped)."""
    text = open(path).read()
    try:
        obj = json.loads(text)
        if isinstance(obj, dict):
            return obj.get("rows", []), obj.get("device")
    except ValueError:
        pass
    rows = []
    for line in text.splitlines():
        if line.strip().startswith("{"):
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut by a timeout
            if "skipped" not in r:  # a note that nothing was measured, not a row
                rows.append(r)
    return rows, None


peer_rows, peer_device = [], None
for path in a.peers:
    rs, dev = read_rows(path)
    peer_rows += rs
    peer_device = peer_device or dev
lajit_rows = read_rows(a.lajit)[0] if os.path.exists(a.lajit) else []
meta = json.load(open(a.meta)) if a.meta and os.path.exists(a.meta) else {}

ceil = {}
for r in peer_rows:
    if r.get("kind") == "ceiling" and "value" in r:
        key = {"d2d_copy_TBps": "copy_TBps", "bf16_mm_TFLOPs": "bf16_TFLOPs"}.get(r.get("what"))
        if key:
            ceil[key] = round(r["value"], 3)
copy = ceil.get("copy_TBps")


def floor_ms(op, B, H, N, D, E):
    """DESIGN.md's minimum bytes (bf16: fwd reads q, k, v and writes o; the backward reads q, k,
    v, dO and writes dq, dk, dv) at the copy rate of the same call."""
    if not copy:
        return None
    fwd = B * H * N * (2 * D + 2 * E) * 2
    bwd = B * H * N * (4 * D + 3 * E) * 2
    return round((fwd if op == "fwd" else fwd + bwd) / (copy * 1e12) * 1e3, 4)


GRID = (4, 32)  # (B, H) of the prefill grid; fwd/fwdbwd rows of any other are long-sequence rows
is_grid = lambda r: (r.get("B"), r.get("H")) == GRID

rows = []
missing = {}  # (op, impl, B, H, D, N) or ("decode", impl, B, T) -> why a peer row is absent
names = {"sdpa_causal": ("sdpa", False), "la2_nodecay": ("la2_nodecay", False),
         "la2_decay": ("la2_decay", True), "fla_simple_gla": ("fla", True)}
for r in peer_rows:
    if r.get("kind") != "prefill" or r.get("name") not in names:
        continue
    impl, decay = names[r["name"]]
    B, H, N, D = r.get("B"), r.get("H"), r.get("N"), r.get("D")
    if "fwd_ms" not in r:
        for op in ("fwd", "fwdbwd"):
            missing[(op, impl, B, H, D, N)] = str(r.get("error", "no time"))[:60]
        continue
    base = dict(impl=impl, dtype=r.get("dtype", "bf16"), B=B, H=H, D=D, E=D, N=N, decay=decay)
    rows.append(dict(op="fwd", **base, ms=round(r["fwd_ms"], 4), floor_ms=floor_ms("fwd", B, H, N, D, D)))
    rows.append(dict(op="fwdbwd", **base, ms=round(r["fwdbwd_ms"], 4),
                     extra_MiB=round(r["peak_extra_MiB"], 1), floor_ms=floor_ms("fwdbwd", B, H, N, D, D)))
# In-place ceilings (torch mul_ in a graph over rotating fp32 states), by (B, H, D): one state
# update per call whatever T, so one ceiling serves every T; the fastest of the call's.
ceil_by = {}
for r in peer_rows:
    if r.get("kind") == "decode" and r.get("name") == "inplace_ceiling" and "TBps" in r:
        k = (r["B"], r.get("H"), r.get("K"))
        if k not in ceil_by or r["TBps"] > ceil_by[k]["TBps"]:
            ceil_by[k] = r
for r in peer_rows:
    if r.get("kind") == "decode" and r.get("name", "").startswith("fla_fused_recurrent"):
        graph = r["name"].endswith("graph")
        impl, T = "fla_graph" if graph else "fla_eager", r.get("T", 1)
        if "us" not in r:
            missing[("decode", impl, r.get("B"), T)] = str(r.get("error", "no time"))[:60]
            continue
        c = ceil_by.get((r["B"], r.get("H"), r.get("K")))
        how = r.get("how") or ("CUDA graph of steps (peer_bench.py)" if graph else "eager Python call")
        rows.append(dict(op="decode", impl=impl, B=r["B"], H=r["H"], D=r["K"], E=r["V"], T=T,
                         state_dtype="f32", us=round(r["us"], 3), TBps=round(r["TBps"], 4),
                         ceiling_TBps=round(c["TBps"], 4) if c else None, l2=r["l2"], how=how,
                         **{k: r[k] for k in ("run", "nbuf") if k in r}))
peer_prefill = {(r["op"], r["impl"], r["B"], r["H"], r["D"], r["N"], r["dtype"]): r
                for r in rows if r.get("op") in ("fwd", "fwdbwd")}
for r in lajit_rows:
    r = dict(r)
    if r.get("op") == "decode":
        # The ceiling is the faster of the two in-place updates of the same run: lajit_bench's
        # kernel and PyTorch's mul_ (the peers), both captured in a graph over the same number of
        # rotating states. The peers' buffers are fp32: a 16-bit pool keeps its own.
        c = ceil_by.get((r["B"], r.get("H"), r.get("D"))) if r.get("state_dtype", "f32") == "f32" else None
        if c and c["TBps"] > r.get("ceiling_TBps", 0):
            r["ceiling_TBps"] = round(c["TBps"], 4)
            r["ceiling_us"] = round(c["us"], 3)
            r["ceiling_from"] = "torch mul_ (" + ("peers_decode.py" if "peers_decode" in c.get("how", "") else "peer_bench.py") + ")"
        else:
            r["ceiling_from"] = "lajit_bench x *= c"
    if r.get("op") in ("fwd", "fwdbwd"):
        r["floor_ms"] = floor_ms(r["op"], r["B"], r["H"], r["N"], r["D"], r.get("E", r["D"]))
        f = peer_prefill.get((r["op"], "fla", r["B"], r["H"], r["D"], r["N"], r.get("dtype", "bf16")))
        if f and r.get("E", r["D"]) == r["D"]:
            r["fla_ms"] = f["ms"]
            r["vs_fla"] = round(r["ms"] / f["ms"], 3)
    rows.append(r)

commit = a.commit
if a.run:
    for r in rows:
        r["run"] = a.run
if a.join:
    old = json.load(open(a.join))
    kept = [r for r in old["rows"] if r.get("run") and r.get("run") != a.run]
    rows = kept + rows
    runs = sorted({r["run"] for r in kept})
    prev = old.get("lajit", "")
    if "(" in prev:  # "sha (run); sha (run)": the entries of runs this call replaces go
        parts = [x.strip() for x in prev.split(";") if x.strip()]
        prev = "; ".join(x for x in parts if not x.endswith(f"({a.run})"))
    else:
        prev = f"{prev} ({', '.join(runs)})"
    commit = f"{a.commit} ({a.run})" + (f"; {prev}" if prev else "")
    if not ceil:  # a call that measured no ceilings (JIT rows only) keeps the report's
        ceil = old.get("ceilings", {})
rep = dict(device=meta.get("device", peer_device), cc=meta.get("cc"), driver=meta.get("driver"),
           lajit=commit, date=datetime.date.today().isoformat(), ceilings=ceil, rows=rows)
os.makedirs(a.out, exist_ok=True)
jpath = os.path.join(a.out, a.gpu + ".json")
json.dump(rep, open(jpath, "w"), indent=1)

# ---- Markdown tables -------------------------------------------------------------------------
md = [f"# lajit benchmark — {rep['device']}", "",
      f"lajit {rep['lajit']}, {rep['date']}, driver {rep['driver']}; ceilings measured in the same run: "
      f"copy {ceil.get('copy_TBps')} TB/s, bf16 matmul {ceil.get('bf16_TFLOPs')} TFLOP/s. "
      "Every lajit row is compared only with peer rows measured in the same device call as it "
      "(lajit_bench and ../shared/peers/peer_bench.py together; rows carry `run` when a report "
      "joins several calls, and decode rows carry the ceiling of their own call). Times in ms (prefill) or µs (decode); lajit's prefill rows are with "
      "decay and compared with every peer, the no-decay ones included.", ""]
num = lambda x, fmt="{:.3f}": fmt.format(x) if isinstance(x, (int, float)) else "—"
impls = ["lajit", "fla", "la2_decay", "la2_nodecay", "sdpa"]
for op in ("fwd", "fwdbwd"):
    ops = [r for r in rows if r.get("op") == op and is_grid(r)]
    if not ops:
        continue
    for D in sorted({r["D"] for r in ops}):
        md += [f"## {op}, bf16, B={GRID[0]}, H={GRID[1]}, D=E={D}", "",
               "| N | " + " | ".join(impls) + " | floor | lajit / best peer |",
               "|---" * (len(impls) + 3) + "|"]
        for N in sorted({r["N"] for r in ops if r["D"] == D}):
            cell, fl = {}, None
            for r in ops:
                if r["D"] == D and r["N"] == N:
                    cell[r["impl"]] = r["ms"]
                    fl = r.get("floor_ms")
            peers_ms = [v for k, v in cell.items() if k != "lajit"]
            # A peer the call ran out of time for is "missing", and no ratio is drawn against
            # the peers that remain (the fastest may be the one missing).
            gone = {i for i in impls if i not in cell and (op, i, *GRID, D, N) in missing}
            ratio = (f"{cell['lajit'] / min(peers_ms):.2f}" if "lajit" in cell and peers_ms and not gone
                     else "—")
            md.append(f"| {N} | " + " | ".join(f"{cell[i]:.3f}" if i in cell else
                                                ("missing" if i in gone else "—") for i in impls)
                      + f" | {fl if fl is not None else '—'} | {ratio} |")
        md.append("")
fb = [r for r in rows if r.get("op") == "fwdbwd" and is_grid(r)]
if fb:
    md += ["## fwdbwd: memory above the inputs during one call (MiB) and lajit with the decay gradient (ms)", "",
           "| D | N | lajit extra | fla extra | la2_decay extra | sdpa extra | lajit fwd+bwd | lajit fwd+bwd with ds |",
           "|---|---|---|---|---|---|---|---|"]
    for D in sorted({r["D"] for r in fb}):
        for N in sorted({r["N"] for r in fb if r["D"] == D}):
            cell = {r["impl"]: r for r in fb if r["D"] == D and r["N"] == N}
            ex = lambda i: f"{cell[i]['extra_MiB']:.0f}" if i in cell and "extra_MiB" in cell[i] else "—"
            l = cell.get("lajit", {})
            md.append(f"| {D} | {N} | {ex('lajit')} | {ex('fla')} | {ex('la2_decay')} | {ex('sdpa')} | "
                      f"{l.get('ms', float('nan')):.3f} | {l.get('ms_ds', float('nan')):.3f} |")
    md.append("")
long_rows = [r for r in rows if r.get("op") in ("fwd", "fwdbwd") and not is_grid(r)]
# Shapes that only a failed or timed-out peer names are listed as well (this call's run).
long_missing = {(k[2], k[3], k[4], k[5], a.run) for k in missing
                if k[0] in ("fwd", "fwdbwd") and (k[2], k[3]) != GRID}
if long_rows or long_missing:
    md += ["## Long sequences, few heads: bf16 with decay, ms (FLA: chunk_simple_gla, same call)", "",
           "floor: DESIGN.md's minimum bytes (fwd (2D + 2E)·2, fwd+bwd (6D + 5E)·2 bytes per token "
           "and head) at the copy rate measured in the same call. FLA \"missing\" where the call "
           "has no FLA row for the shape (its reason, e.g. a timeout of its autotuning, beside it).", "",
           "| B | H | D | N | op | lajit | lajit with ds | FLA | floor | lajit / floor | lajit / FLA | "
           "lajit extra MiB | FLA extra MiB |", "|---" * 13 + "|"]
    shapes = sorted({(r["B"], r["H"], r["D"], r["N"], r.get("run")) for r in long_rows} | long_missing,
                    key=lambda s: (str(s[4]), s[0] * s[1], s[2], s[3], s[0]))
    for B, H, D, N, run in shapes:
        for op in ("fwd", "fwdbwd"):
            sel = [r for r in long_rows if (r["B"], r["H"], r["D"], r["N"], r.get("run"), r["op"]) == (B, H, D, N, run, op)]
            l = next((r for r in sel if r["impl"] == "lajit"), None)
            f = next((r for r in sel if r["impl"] == "fla"), None)
            if not l and not f and (op, "fla", B, H, D, N) not in missing:
                continue
            fl = (l or f or {}).get("floor_ms", floor_ms(op, B, H, N, D, D))
            fs = num(f["ms"]) if f else "missing" + (f" ({missing[(op, 'fla', B, H, D, N)]})"
                                                       if (op, "fla", B, H, D, N) in missing else "")
            md.append(f"| {B} | {H} | {D} | {N} | {op} | {num(l['ms']) if l else 'missing'} | "
                      f"{num(l.get('ms_ds')) if l and op == 'fwdbwd' else '—'} | {fs} | {num(fl, '{:.4g}')} | "
                      f"{num(l['ms'] / fl, '{:.2f}') if l and fl else '—'} | "
                      f"{num(l['ms'] / f['ms'], '{:.2f}') if l and f else '—'} | "
                      f"{num(l.get('extra_MiB'), '{:.0f}') if l else '—'} | "
                      f"{num(f.get('extra_MiB'), '{:.0f}') if f else '—'} |")
    md.append("")
jit = [r for r in rows if r.get("op") == "jit"]
if jit:
    md += ["## JIT start-up and tuning (wall seconds, each in a fresh process)", "",
           "| what | family | problem | s | default → tuned, or the bundle |", "|---|---|---|---|---|"]
    for r in jit:
        prob = r.get("problem") or f"bf16 B={r.get('B')} H={r.get('H')} N={r.get('N')} D={r.get('D')}"
        tuned = (f"{r['default_config']} {r['default_ms']:.4f} ms → {r['tuned_config']} {r['tuned_ms']:.4f} ms "
                 f"({r['default_ms'] / r['tuned_ms']:.2f}×)" if "tuned_ms" in r else
                 f"bundle {r['bundle']}, NVRTC {r.get('nvrtc', 'present')}" if "bundle" in r else "")
        md.append(f"| {r['what']} | {r['family']} | {prob} | {r['s']:.4f} | {tuned} |")
    md.append("")
dec = [r for r in rows if r.get("op") == "decode"]
sd_name = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
if dec:
    lj = [r for r in dec if r["impl"] == "lajit"]
    # One table per shape: heads, head width, pool dtype, input dtype, layout. FLA's rows (bf16
    # inputs, KV, fp32 state) sit beside the bf16-input KV tables only.
    shape_of = lambda r: (r.get("H"), r.get("D"), r.get("state_dtype", "f32"), r.get("dtype", "bf16"),
                          int(bool(r.get("vk"))))
    groups = sorted({shape_of(r) for r in lj} or {(r.get("H"), r.get("D"), "f32", "bf16", 0) for r in dec},
                    key=lambda g: (g[3] != "bf16", g[4], g[0], g[1], g[2] != "f32", g[2], g[3]))
    for H, D, sd, ind, vk in groups:
        with_fla = ind == "bf16" and not vk
        # PDL columns of this table's own rows (None: measured without --pdl, the default context)
        pdls = sorted({r.get("pdl") for r in lj if shape_of(r) == (H, D, sd, ind, vk)},
                      key=lambda x: (x is not None, x)) or [None]
        lab = lambda p: "lajit" if len(pdls) == 1 or p is None else f"lajit pdl={p}"
        head = "| B | T | " + " | ".join(f"{lab(p)} | % of ceiling" for p in pdls) + \
               " | in-place ceiling | FLA (graph, fp32 state) | lajit / FLA |"
        md += [f"## decode, H={H}, D=E={D}, {sd_name.get(ind, ind)} q/k/v, "
               f"{'VK layout, ' if vk else ''}{sd_name.get(sd, sd)} state pool, cold L2 "
               "(µs per step (TB/s), % of the in-place ceiling of the same pool dtype and call)", "",
               head, "|---" * head.count(" | ") + "|---|"]
        if sd != "f32" and with_fla:
            md[-2:-2] = [f"The ceiling is lajit_bench's x *= c on {sd_name.get(sd, sd)} states of the same "
                         "element count; FLA keeps an fp32 state, so its times (the same column as in the "
                         "fp32 table) are for twice the bytes.", ""]
        for T in sorted({r.get("T", 1) for r in dec}):
            for B in sorted({r["B"] for r in dec}):
                mine = {r.get("pdl"): r for r in lj if r["B"] == B and r.get("T", 1) == T
                        and shape_of(r) == (H, D, sd, ind, vk)}
                fl = [r for r in dec if with_fla and r["impl"] == "fla_graph" and r["B"] == B
                      and r.get("T", 1) == T and r.get("l2") == "cold" and (r.get("H"), r.get("D")) == (H, D)]
                # peers_decode.py's row (T 1 and 4 timed alike) before peer_bench.py's
                f = sorted(fl, key=lambda r: "peers_decode" not in r.get("how", ""))[0] if fl else None
                if not mine and (not f or not any(shape_of(r) == (H, D, sd, ind, vk) for r in lj)):
                    continue
                cells = []
                for p in pdls:
                    l = mine.get(p)
                    cells.append(f"{l['us']:.1f} ({l['TBps']:.2f})" if l else "—")
                    cells.append(f"{100 * l['TBps'] / l['ceiling_TBps']:.1f} %" if l and l.get("ceiling_TBps") else "—")
                c = next((l for l in mine.values() if "ceiling_us" in l), None)
                cs = f"{c['ceiling_us']:.1f} ({c['ceiling_TBps']:.2f})" if c else "—"
                why = missing.get(("decode", "fla_graph", B, T)) if with_fla else None
                fs = f"{f['us']:.1f} ({f['TBps']:.2f})" if f else (f"missing ({why})" if why else "—")
                best = min((l["us"] for l in mine.values()), default=None)
                ratio = f"{best / f['us']:.2f}" if best and f else "—"
                md.append(f"| {B} | {T} | " + " | ".join(cells) + f" | {cs} | {fs} | {ratio} |")
        md.append("")
cp = [r for r in rows if r.get("op") == "cp"]
if cp:
    md += ["## Context parallelism (lajit_bench --mode cp): one layer, bf16 with decay, ms "
           "(the slowest rank per repetition, median)", "",
           "| scaling | exchange | segments | GPUs | B | H | D | tokens per GPU | fwd+bwd | exchange ms | "
           "exchange share | efficiency t(1)/t(P) | fwd | fwd efficiency |", "|---" * 14 + "|"]
    for r in sorted(cp, key=lambda r: (r.get("scaling", ""), r.get("exchange", ""), r.get("segments", "off"), r["gpus"])):
        f = lambda k, fmt="{:.3f}": fmt.format(r[k]) if isinstance(r.get(k), (int, float)) else "—"
        md.append(f"| {r.get('scaling', '—')} | {r.get('exchange', '—')} | {r.get('segments', 'off')} | {r['gpus']} | {r['B']} | {r['H']} | {r['D']} | {r['N']} | "
                  f"{f('ms')} | {f('exchange_ms')} | {f('exchange_share', '{:.1%}')} | "
                  f"{f('weak_efficiency', '{:.2f}')} | {f('ms_fwd')} | {f('weak_efficiency_fwd', '{:.2f}')} |")
    md.append("")
disp = [r for r in rows if r.get("op") == "dispatch" and "us_host" in r]
for r in disp:
    md += [f"Host cost of one `{r.get('what')}` call on a cached kernel: {r['us_host']:.3f} µs; a bare "
           f"cuLaunchKernel of an empty kernel: {r['us_launch']:.3f} µs ({r.get('how', '')}).", ""]

# ---- Plots: prefill time against N, log-log, per D; decode time against B ---------------------
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pre = [r for r in rows if r.get("op") in ("fwd", "fwdbwd") and is_grid(r)]
    Ds = sorted({r["D"] for r in pre})
    ops_present = [o for o in ("fwd", "fwdbwd") if any(r["op"] == o for r in pre)]
    if Ds and ops_present:
        fig, axes = plt.subplots(len(ops_present), len(Ds), figsize=(6 * len(Ds), 4.5 * len(ops_present)), squeeze=False)
        for i, op in enumerate(ops_present):
            for j, D in enumerate(Ds):
                ax = axes[i][j]
                for impl in impls:
                    pts = sorted((r["N"], r["ms"]) for r in pre if r["op"] == op and r["D"] == D and r["impl"] == impl)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", label=impl, linewidth=2.5 if impl == "lajit" else 1.2)
                fl = sorted({(r["N"], r["floor_ms"]) for r in pre if r["op"] == op and r["D"] == D and r.get("floor_ms")})
                if fl:
                    ax.plot(*zip(*fl), "k--", label="bandwidth floor")
                ax.set_xscale("log", base=2); ax.set_yscale("log")
                ax.set_title(f"{op}, bf16, B={GRID[0]}, H={GRID[1]}, D=E={D}"); ax.set_xlabel("N"); ax.set_ylabel("ms")
                ax.grid(True, which="both", alpha=0.3); ax.legend(fontsize=8)
        fig.suptitle(f"lajit vs peers on {rep['device']} (one run)")
        fig.tight_layout()
        png = os.path.join(a.out, a.gpu + ".png")
        fig.savefig(png, dpi=110)
        plt.close(fig)
        md.insert(4, f"![time against N]({a.gpu}.png)\n")
    d1 = [r for r in rows if r.get("op") == "decode" and r.get("T", 1) == 1 and r.get("D") == 128
          and r.get("H") == 64 and r.get("dtype", "bf16") == "bf16" and not r.get("vk")]
    lj1 = [r for r in d1 if r.get("impl") == "lajit"]
    if lj1:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        variants = sorted({(r.get("state_dtype", "f32"), r.get("pdl")) for r in lj1},
                          key=lambda v: (v[0] != "f32", v[0], v[1] is not None, v[1]))
        for sd, pdl in variants:
            pts = sorted((r["B"], r["us"]) for r in lj1 if (r.get("state_dtype", "f32"), r.get("pdl")) == (sd, pdl))
            lab = f"lajit ({sd_name.get(sd, sd)} pool" + ("" if pdl is None else f", pdl={pdl}") + ", T=1)"
            ax.plot(*zip(*pts), marker="o", linewidth=2.5 if sd == "f32" else 1.8,
                    linestyle="-" if sd == "f32" else "-.", label=lab)
        fla = sorted({(r["B"], r["us"]) for r in d1 if r.get("impl") == "fla_graph" and r.get("l2") == "cold"
                      and "peers_decode" not in r.get("how", "")}
                     or {(r["B"], r["us"]) for r in d1 if r.get("impl") == "fla_graph" and r.get("l2") == "cold"})
        if fla:
            ax.plot(*zip(*fla), marker="o", label="FLA fused_recurrent (graph, fp32 state)")
        for sd, style in (("f32", "k--"), ("bf16", "k:")):
            cp_ = {}
            for r in lj1:
                if r.get("state_dtype", "f32") == sd and "ceiling_us" in r:
                    cp_.setdefault(r["B"], r["ceiling_us"])
            if cp_:
                ax.plot(*zip(*sorted(cp_.items())), style, label=f"in-place update ceiling ({sd_name.get(sd, sd)})")
        ax.set_xscale("log", base=2); ax.set_yscale("log")
        ax.set_xlabel("B (H=64, D=E=128, cold L2)"); ax.set_ylabel("µs per step")
        ax.set_title(f"decode on {rep['device']} (one run)")
        ax.grid(True, which="both", alpha=0.3); ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(a.out, a.gpu + "-decode.png"), dpi=110)
        plt.close(fig)
        md.insert(4, f"![decode time against B]({a.gpu}-decode.png)\n")
except ImportError:
    md.append("(matplotlib missing: no plot)")
open(os.path.join(a.out, a.gpu + ".md"), "w").write("\n".join(md) + "\n")
print(f"wrote {jpath} ({len(rows)} rows)")
