#!/usr/bin/env python3
"""Throwaway expander for templates/la_fwd/fwd.cu until the Lua template engine lands: replaces
${NAME} with the given constants (the template uses no //% lines). Usage:
  expand_fwd.py TEMPLATE OUT NAME=VALUE ..."""
import re, sys
src = open(sys.argv[1]).read()
consts = dict(a.split('=', 1) for a in sys.argv[3:])
def sub(m):
    k = m.group(1)
    if k not in consts:
        sys.exit('missing constant ' + k)
    return consts[k]
out = re.sub(r'\$\{([A-Za-z_][A-Za-z0-9_]*)\}', sub, src)
open(sys.argv[2], 'w').write(out)
