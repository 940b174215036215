#!/usr/bin/env python3
"""Registers, stack and spills per probe variant from `nvcc -Xptxas -v` output.
Usage: ptxas_summary.py ptxas.log decode_variants.cuh"""
import re, sys
cur, out = None, {}
for l in open(sys.argv[1]):
    m = re.search(r"Compiling entry function '(\w+)'", l)
    if m: cur = m.group(1); out[cur] = ''
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", l)
    if m and cur: out[cur] += ' stack %s spill %s/%s' % m.groups()
    m = re.search(r"Used (\d+) registers", l)
    if m and cur: out[cur] += ' regs %s' % m.group(1)
for n, i in re.findall(r'\{"([^"]+)", \(const void \*\)v(\d+)::', open(sys.argv[2]).read()):
    print(i.rjust(2), n.ljust(46), out.get('la_decode_v' + i))
