#!/usr/bin/env python3
"""bench_report_test.py — CPU checks of the benchmark's report path (no GPU, no torch).

  bench_report_test.py SOURCE_DIR report       bench/report.py on the fixture of
      tests/data/bench (lajit_bench rows: the B = 4, H = 32 grid, the long-sequence shapes, decode
      with fp32 and bf16 pools and pdl 0/1; peer_bench.py's --out; peers_decode.py's and
      peer_bench.py's printed rows with a failed and a timed-out shape): the report's rows, the
      long-sequence and decode tables, an old report joined, a call without peers;
      bench/peers_decode.py's pool plan.
  bench_report_test.py SOURCE_DIR run_device   bench/run_device.sh in a scratch copy with a fake
      nvidia-smi, lajit_bench and peer_bench.py: the chosen steps only, a step that runs out of
      time does not stop the next, the report is written, a missing FLA shape is marked.
Exits 1 with the failed checks listed."""
import json, os, re, shutil, subprocess, sys, tempfile

src, what = sys.argv[1], sys.argv[2]
data = os.path.join(src, "tests", "data", "bench")
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
    return cond


def report(out, *args):
    r = subprocess.run([sys.executable, os.path.join(src, "bench", "report.py"), "--gpu", "fx",
                        "--commit", "abc", "--out", out, *args], capture_output=True, text=True)
    check(r.returncode == 0, f"report.py {' '.join(args)} failed: {r.stderr[-800:]}")
    j = json.load(open(os.path.join(out, "fx.json"))) if r.returncode == 0 else {"rows": []}
    m = open(os.path.join(out, "fx.md")).read() if r.returncode == 0 else ""
    return j, m


def section(md, title):
    """The text of the markdown section whose heading starts with title."""
    i = md.find("## " + title)
    if i < 0:
        return ""
    j = md.find("\n## ", i + 3)
    return md[i:] if j < 0 else md[i:j]


LONG = [(1, 8, 128, 65536), (1, 8, 128, 262144), (1, 8, 128, 1048576), (2, 16, 64, 131072),
        (1, 64, 128, 65536), (1, 1, 128, 1048576)]
NEED = {"fwd": ["impl", "dtype", "B", "H", "D", "E", "N", "decay", "ms"],
        "fwdbwd": ["impl", "dtype", "B", "H", "D", "E", "N", "decay", "ms", "extra_MiB"],
        "decode": ["impl", "B", "H", "D", "E", "T", "us", "TBps", "ceiling_TBps", "l2", "how"],
        "dispatch": ["impl", "us_host"]}

if what == "report":
    tmp = tempfile.mkdtemp(prefix="lj-report-")
    full = ["--lajit", f"{data}/lajit.jsonl", "--meta", f"{data}/meta.json", "--peers", f"{data}/peers.json",
            "--peers", f"{data}/peers-decode.jsonl", "--peers", f"{data}/peers-long.jsonl"]
    rep, md = report(os.path.join(tmp, "a"), *full)
    rows = rep["rows"]
    for i, r in enumerate(rows):
        miss = [f for f in NEED.get(r.get("op"), ["unknown op"]) if f not in r]
        check(not miss, f"row {i} ({r.get('op')}): missing {miss}")
    copy = rep.get("ceilings", {}).get("copy_TBps")
    check(copy == 4.25, f"copy ceiling {copy}, want 4.25 (the last measured in the call)")
    # Long sequences: every shape, both ops, with its floor; the ratio to FLA where FLA ran.
    for B, H, D, N in LONG:
        for op, per_tok in (("fwd", 4 * D), ("fwdbwd", 11 * D)):
            l = [r for r in rows if (r.get("op"), r.get("impl"), r.get("B"), r.get("H"), r.get("D"), r.get("N"))
                 == (op, "lajit", B, H, D, N)]
            if not check(len(l) == 1, f"{op} {B},{H},{D},{N}: {len(l)} lajit rows"):
                continue
            want = B * H * N * per_tok * 2 / (4.25e12) * 1e3
            check(abs(l[0].get("floor_ms", 0) - want) < 1e-3 * want + 1e-4,
                  f"{op} {B},{H},{D},{N}: floor {l[0].get('floor_ms')} want {want:.4f}")
            f = [r for r in rows if (r.get("op"), r.get("impl"), r.get("B"), r.get("H"), r.get("D"), r.get("N"))
                 == (op, "fla", B, H, D, N)]
            if (B, H, D) == (2, 16, 64):
                check(not f and "vs_fla" not in l[0], f"{op} {B},{H},{D},{N}: FLA timed out, yet a row")
            elif check(len(f) == 1, f"{op} {B},{H},{D},{N}: {len(f)} FLA rows"):
                check(abs(l[0].get("vs_fla", 0) - l[0]["ms"] / f[0]["ms"]) < 2e-3,
                      f"{op} {B},{H},{D},{N}: vs_fla {l[0].get('vs_fla')}")
    lt = section(md, "Long sequences")
    check(lt.count("\n| ") == 13, f"long table: {lt.count(chr(10) + '| ')} lines, want 13 (head + 12 rows)")
    check("missing (timeout after 150 s)" in lt, "long table: the timed-out FLA shape is not marked")
    for title in ("fwd, bf16, B=4, H=32, D=E=128", "fwdbwd, bf16, B=4, H=32, D=E=64", "fwdbwd: memory"):
        s = section(md, title)
        check(s and "65536" not in s and "131072" not in s, f"grid section {title!r} missing or mixed with long rows")
    # Decode: pools and pdl carried; each pool's ceiling its own (the fp32 torch ceiling only
    # raises fp32 rows); FLA at T = 1 and 4.
    dec = [r for r in rows if r.get("op") == "decode" and r.get("impl") == "lajit"]
    check(len(dec) == 24 and {r.get("pdl") for r in dec} == {0, 1}, f"{len(dec)} lajit decode rows, pdl {set(r.get('pdl') for r in dec)}")
    for r in dec:
        if r["state_dtype"] == "bf16":
            check(r["ceiling_TBps"] == 4.0 and r["ceiling_from"].startswith("lajit_bench"),
                  f"bf16 pool B={r['B']} T={r['T']}: ceiling {r['ceiling_TBps']} from {r['ceiling_from']} (want its own 4.0)")
        else:
            check(r["ceiling_TBps"] > 4.3 and "torch" in r["ceiling_from"],
                  f"fp32 pool B={r['B']}: ceiling {r['ceiling_TBps']} from {r['ceiling_from']} (want the faster torch one)")
    fla = {(r["B"], r["T"]) for r in rows if r.get("op") == "decode" and r.get("impl") == "fla_graph" and r.get("l2") == "cold"}
    check({(1, 4), (4, 4), (1, 1), (256, 1)} <= fla and (256, 4) not in fla, f"FLA graph decode rows {sorted(fla)}")
    for pool in ("fp32", "bf16"):
        s = section(md, "decode, H=64, D=E=128, bf16 q/k/v, " + pool + " state pool")
        check("lajit pdl=0" in s and "lajit pdl=1" in s, f"decode {pool} table: no pdl columns")
        check(s.count("\n| ") == 7, f"decode {pool} table: {s.count(chr(10) + '| ')} lines, want 7")
        check("| 256 | 4 |" in s and "missing (RuntimeError" in s, f"decode {pool} table: failed FLA shape not marked")
    s = section(md, "decode, H=64, D=E=128, bf16 q/k/v, bf16 state pool")
    check("| 1 | 1 | 1.2 (3.64) | 90.9 % |" in s, "bf16 pool B=1 T=1: not 90.9 % of its own ceiling")
    # Decode rows of other shapes (a VK layout, fp16 inputs) get tables of their own, without FLA,
    # and leave the default tables as they were.
    extra = os.path.join(tmp, "extra.jsonl")
    with open(extra, "w") as fh:
        for dt, vk, us in (("bf16", 1, 4.0), ("f16", 0, 5.0)):
            fh.write(json.dumps({"op": "decode", "impl": "lajit", "dtype": dt, "state_dtype": "f32",
                                 "vk": vk, "B": 1, "H": 64, "D": 128, "E": 128, "T": 1, "us": us,
                                 "TBps": 2.0, "ceiling_us": 3.4, "ceiling_TBps": 2.5, "l2": "cold",
                                 "how": "fixture"}) + "\n")
    _, md_x = report(os.path.join(tmp, "x"), *full, "--run", "first")
    rep_x2, md_x2 = report(os.path.join(tmp, "x2"), "--lajit", extra, "--run", "second", "--join",
                           os.path.join(tmp, "x", "fx.json"))
    s_vk = section(md_x2, "decode, H=64, D=E=128, bf16 q/k/v, VK layout, fp32 state pool")
    s_16 = section(md_x2, "decode, H=64, D=E=128, fp16 q/k/v, fp32 state pool")
    check("| 1 | 1 | 4.0 (2.00) | 80.0 % |" in s_vk and "pdl" not in s_vk, f"VK table: {s_vk[:300]}")
    check("| 1 | 1 | 5.0 (2.00) | 80.0 % |" in s_16, f"fp16-input table: {s_16[:300]}")
    # (a joined report does not keep why a peer row is missing: "missing (...)" becomes "—")
    unmark = lambda text: [re.sub(r"missing \([^|]*\)", "—", line) for line in text.splitlines()
                           if line.startswith("| ")]
    for pool in ("fp32", "bf16"):
        t = "decode, H=64, D=E=128, bf16 q/k/v, " + pool + " state pool"
        check(unmark(section(md_x2, t)) == unmark(section(md_x, t)),
              f"{pool} default table changed by other shapes' rows")
    # A later call joined to this report: both kept, each with its own run.
    rep_a, _ = report(os.path.join(tmp, "b"), *full, "--run", "first")
    rep_b, md_b = report(os.path.join(tmp, "c"), "--lajit", f"{data}/lajit.jsonl", "--run", "second",
                         "--join", os.path.join(tmp, "b", "fx.json"))
    runs = {}
    for r in rep_b["rows"]:
        runs[r.get("run")] = runs.get(r.get("run"), 0) + 1
    check(runs.get("first") == len(rep_a["rows"]), f"join kept {runs.get('first')} of {len(rep_a['rows'])} rows")
    check(rep_b.get("ceilings", {}).get("copy_TBps") == 4.25, "a call without ceilings lost the joined report's")
    # No peers at all: a report still, floors unknown.
    rep_n, md_n = report(os.path.join(tmp, "d"), "--lajit", f"{data}/lajit.jsonl")
    check(rep_n["rows"] and all(r.get("floor_ms") is None for r in rep_n["rows"] if r.get("op") == "fwd"),
          "without peers: no rows, or floors without a copy rate")
    check("missing" in section(md_n, "Long sequences"), "without peers: FLA not marked missing")
    # An old report of the repository (rows from before this format) joined: every row kept.
    old = os.path.join(src, "docs", "bench", "h200.json")
    if os.path.exists(old):
        n_old = len(json.load(open(old))["rows"])
        rep_o, md_o = report(os.path.join(tmp, "e"), "--lajit", os.devnull, "--run", "x", "--join", old)
        check(len(rep_o["rows"]) == n_old, f"old report: {len(rep_o['rows'])} of {n_old} rows kept")
        check(section(md_o, "decode, H=64, D=E=128, bf16 q/k/v, fp32 state pool").count("\n| ") >= 8,
              "old report: no decode table")
    # peers_decode.py's pool plan (its GPU part needs torch and FLA).
    r = subprocess.run([sys.executable, os.path.join(src, "bench", "peers_decode.py"), "--plan", "--B", "1,256"],
                       capture_output=True, text=True)
    plan = [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]
    check([(p["nbuf"], p["steps"]) for p in plan] == [(64, 64), (1, 20)], f"peers_decode.py --plan: {r.stdout} {r.stderr[-300:]}")
    shutil.rmtree(tmp, ignore_errors=True)

elif what == "run_device":
    tmp = tempfile.mkdtemp(prefix="lj-run-device-")
    os.makedirs(os.path.join(tmp, "bench"))
    os.makedirs(os.path.join(tmp, "build", "bench"))
    os.makedirs(os.path.join(tmp, "fakebin"))
    for f in ("run_device.sh", "report.py", "peers_decode.py"):
        shutil.copy(os.path.join(src, "bench", f), os.path.join(tmp, "bench", f))

    def script(path, text):
        open(path, "w").write(text)
        os.chmod(path, 0o755)
    script(os.path.join(tmp, "fakebin", "nvidia-smi"), "#!/bin/sh\necho 'NVIDIA FAKE, 1.0, 9.0'\n")
    # lajit_bench: one row per call; the (2, 16, 64) shape hangs (cut by its limit). The prefill
    # step's call (fwdbwd over the default grid: no --B) says so on stderr and gives a fwd and a
    # fwdbwd row.
    script(os.path.join(tmp, "build", "bench", "lajit_bench"), r"""#!/bin/sh
case "$*" in *--help*) echo "[--pdl 0,1]"; exit 0;; esac
echo "lajit_bench $*" >&2
case "$*" in
 *"--mode decode"*) echo '{"op": "decode", "impl": "lajit", "state_dtype": "bf16", "B": 1, "H": 64, "D": 128, "E": 128, "T": 1, "pdl": 1, "us": 3.0, "TBps": 2.8, "ceiling_us": 2.9, "ceiling_TBps": 2.9, "l2": "cold", "how": "fake"}';;
 *"--mode fwdbwd --B"*) [ "$6" = 16 ] && exec sleep 60
    echo "{\"op\": \"fwd\", \"impl\": \"lajit\", \"dtype\": \"bf16\", \"B\": $4, \"H\": $6, \"D\": $8, \"E\": $8, \"N\": ${10%%,*}, \"decay\": true, \"ms\": 1.0}";;
 *"--mode fwdbwd"*) echo PREFILL_RAN >&2
    echo '{"op": "fwd", "impl": "lajit", "dtype": "bf16", "B": 4, "H": 32, "D": 128, "E": 128, "N": 8192, "decay": true, "ms": 0.3}'
    echo '{"op": "fwdbwd", "impl": "lajit", "dtype": "bf16", "B": 4, "H": 32, "D": 128, "E": 128, "N": 8192, "decay": true, "ms": 1.0, "ms_ds": 1.5, "extra_MiB": 1024}';;
esac
""")
    script(os.path.join(tmp, "peer_bench.py"), """import json, sys, time
a = sys.argv
open("peer_args.txt", "a").write(" ".join(a[1:]) + "\\n")
if "ceil" in a:
    print(json.dumps({"kind": "ceiling", "what": "d2d_copy_TBps", "value": 4.0})); sys.exit(0)
if "--B" not in a:  # the peers step: its grid (one row here)
    print(json.dumps({"kind": "prefill", "name": "fla_simple_gla", "dtype": "bf16", "B": 4, "H": 32, "D": 128,
                      "N": 8192, "fwd_ms": 0.8, "fwdbwd_ms": 3.9, "peak_extra_MiB": 3072.0})); sys.exit(0)
B, H, D, N = (a[a.index(k) + 1] for k in ("--B", "--H", "--D", "--N"))
if D == "64":
    time.sleep(60)
print(json.dumps({"kind": "prefill", "name": "fla_simple_gla", "dtype": "bf16", "B": int(B), "H": int(H),
                  "D": int(D), "N": int(N.split(",")[0]), "fwd_ms": 2.0, "fwdbwd_ms": 6.0, "peak_extra_MiB": 1.0}))
""")
    open(os.path.join(tmp, "build", "CMakeCache.txt"), "w").write(f"CMAKE_HOME_DIRECTORY:INTERNAL={tmp}\n")
    out = os.path.join(tmp, "out")
    env = dict(os.environ, PATH=os.path.join(tmp, "fakebin") + os.pathsep + os.environ["PATH"], OUT=out,
               PEER_BENCH="peer_bench.py", PEERS_WHL="", LONG_TIMEOUT="2", PEERS_LONG_TIMEOUT="3", PEERS_LONG_TIMEOUT_D64="3",
               DEADLINE="60", REPORT_RESERVE="5")
    r = subprocess.run(["bash", "bench/run_device.sh", "fx", "decode", "long", "peers-decode", "peers-long", "report"],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"run_device.sh exited {r.returncode}: {r.stderr[-500:]}")
    err = open(os.path.join(out, "bench.err")).read() if os.path.exists(os.path.join(out, "bench.err")) else ""
    check("--state 32,16" in err and "--pdl 0,1" in err and "--T 1,4" in err, f"decode arguments: {err[:300]}")
    check("PREFILL_RAN" not in err and not os.path.exists(os.path.join(out, "gpu-tests.log")),
          "steps that were not chosen ran")
    check(err.count("--mode fwdbwd") == 4, f"long: {err.count('--mode fwdbwd')} lajit_bench calls, want 4")
    steps = open(os.path.join(out, "steps.log")).read() if os.path.exists(os.path.join(out, "steps.log")) else ""
    check("peers_decode.py" in steps, "peers-decode's failure (no torch here) not logged")
    for f in ("peers-long-1-8-128.log", "peers-long-2-16-64.log", "peers-decode.log", "report.log"):
        check(os.path.exists(os.path.join(out, f)), f"no {f} under OUT")
    jpath = os.path.join(out, "report", "fx.json")
    if check(os.path.exists(jpath), "no report"):
        rows = json.load(open(jpath))["rows"]
        lj = {(r["B"], r["H"], r["D"]) for r in rows if r.get("op") == "fwd" and r.get("impl") == "lajit"}
        fl = {(r["B"], r["H"], r["D"]) for r in rows if r.get("op") == "fwd" and r.get("impl") == "fla"}
        check(lj == {(1, 8, 128), (1, 64, 128), (1, 1, 128)}, f"lajit long rows {sorted(lj)}")
        check(fl == {(1, 8, 128), (1, 64, 128), (1, 1, 128)}, f"FLA long rows {sorted(fl)}")
        check(all(r.get("floor_ms") for r in rows if r.get("op") == "fwd"), "long rows without a floor")
        md = open(os.path.join(out, "report", "fx.md")).read()
        check("missing (timeout after 3 s)" in md, "the FLA shape cut by its limit is not marked in the report")
    # The prefill step chosen: lajit_bench fwdbwd over the grid, its rows (fwd, and fwdbwd with ds)
    # in this call's report.
    out2 = os.path.join(tmp, "out2")
    env["OUT"] = out2
    # With the peers, as PEERS_MODES asks: one peer_bench.py run per mode, all their rows used.
    env["PEERS_MODES"] = "ceil prefill"
    env["PREFILL_ARGS"], env["PEERS_ARGS"] = "--D 128 --N 8192", "--D 128 --N 8192"
    r = subprocess.run(["bash", "bench/run_device.sh", "fx", "prefill", "peers", "report"],
                       cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"run_device.sh prefill exited {r.returncode}: {r.stderr[-500:]}")
    err2 = open(os.path.join(out2, "bench.err")).read() if os.path.exists(os.path.join(out2, "bench.err")) else ""
    check("PREFILL_RAN" in err2 and err2.count("lajit_bench") == 1, f"prefill step: {err2[:300]}")
    jpath = os.path.join(out2, "report", "fx.json")
    if check(os.path.exists(jpath), "no report from the prefill step"):
        rows = json.load(open(jpath))["rows"]
        check(any(r.get("op") == "fwdbwd" and r.get("ms_ds") == 1.5 for r in rows),
              f"the prefill step's fwdbwd row is not in the report: {rows}")
        check(any(r.get("op") == "fwdbwd" and r.get("impl") == "fla" and r.get("ms") == 3.9 for r in rows),
              f"the peers step's FLA row is not in the report: {rows}")
        check(json.load(open(jpath))["ceilings"].get("copy_TBps") == 4.0, "the ceil mode's copy rate is not the report's")
    check("--mode fwdbwd --D 128 --N 8192" in err2, f"PREFILL_ARGS not passed to lajit_bench: {err2[:300]}")
    pargs = open(os.path.join(tmp, "peer_args.txt")).read() if os.path.exists(os.path.join(tmp, "peer_args.txt")) else ""
    check(pargs.count("--N 1024,2048,4096,8192,16384,32768 --D 128 --N 8192") == 2,
          f"PEERS_ARGS not after the grid in both peer runs: {pargs}")
    for f in ("peers-ceil.log", "peers-prefill.log"):
        check(os.path.exists(os.path.join(out2, f)), f"no {f}: PEERS_MODES not run mode by mode")
    shutil.rmtree(tmp, ignore_errors=True)
else:
    sys.exit(f"unknown check {what}")

for f in fails:
    print("FAIL:", f)
print(f"{what}: {'FAILED' if fails else 'OK'} ({len(fails)} failed checks)")
sys.exit(1 if fails else 0)
