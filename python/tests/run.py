"""run.py — runs the test_* functions of the given test files without pytest (pytest runs the
same files as they are). A test is skipped by raising unittest.SkipTest, which pytest also
understands. Exit status: 0 all passed or skipped, 1 a failure, 77 everything skipped.

    python run.py test_cpu_package.py [test_gpu_ops.py ...] [-k SUBSTRING]"""
import importlib.util
import os
import sys
import time
import traceback
import unittest


def main(argv):
    pattern = None
    if "-k" in argv:
        i = argv.index("-k")
        pattern = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    passed, failed, skipped = [], [], []
    for path in argv:
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        name = os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except unittest.SkipTest as e:
            print(f"SKIP {name}: {e}", flush=True)
            skipped.append(name)
            continue
        for fname in sorted(n for n in dir(mod) if n.startswith("test_")):
            if pattern and pattern not in fname:
                continue
            t0 = time.time()
            try:
                getattr(mod, fname)()
            except unittest.SkipTest as e:
                print(f"SKIP {name}.{fname}: {e}", flush=True)
                skipped.append(fname)
            except Exception:
                print(f"FAIL {name}.{fname}", flush=True)
                traceback.print_exc()
                failed.append(fname)
            else:
                print(f"ok   {name}.{fname} ({time.time() - t0:.1f} s)", flush=True)
                passed.append(fname)
    print(f"{len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped")
    if failed:
        return 1
    return 77 if skipped and not passed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
