"""Minimal callgrind out parser: self cost per function, inclusive cost per call edge."""
import re
from collections import defaultdict
def parse(path):
    names = {}          # fn id -> name
    obnames = {}
    selfc = defaultdict(int)
    edges = defaultdict(int)   # (caller, callee) -> inclusive cost
    ncalls = defaultdict(int)
    cur = None; ob = None; cob = None; cfn = None; pending_call = False
    def resolve(kind, s, table):
        m = re.match(r'\((\d+)\)(?: (.*))?$', s)
        if m:
            if m.group(2) is not None: table[m.group(1)] = m.group(2)
            return table[m.group(1)]
        return s
    for line in open(path):
        line = line.rstrip('\n')
        if not line: continue
        c = line[0]
        if c.isdigit() or c in '+-*':
            parts = line.split()
            if len(parts) < 2: continue
            cost = int(parts[1])
            if pending_call:
                edges[(cur, cfn)] += cost
                pending_call = False
            else:
                selfc[cur] += cost
            continue
        if line.startswith('fn='):
            cur = resolve('fn', line[3:], names)
        elif line.startswith('ob='):
            ob = resolve('ob', line[3:], obnames)
        elif line.startswith('cob='):
            cob = resolve('ob', line[4:], obnames)
        elif line.startswith('cfn=') or line.startswith('cfi=') and False:
            name = resolve('fn', line[4:], names)
            cfn = name
            cob = None
        elif line.startswith('calls='):
            pending_call = True
            ncalls[(cur, cfn)] += int(line[6:].split()[0])
    return selfc, edges, ncalls
