"""Per-cycle costs as the least-squares slope of cost against cycles over the 3 s, 6 s and
10 s runs (set-up cancels); also the slopes of the pairs 3-6 and 6-10 for the spread."""
import json, re, sys
sys.path.insert(0, '/tmp/cg2/analysis')
from cgparse import parse
from percycle import load, cycles
D = '/tmp/cgruns2'; SECS = (3, 6, 10)
def slope(xs, ys):
    n = len(xs); mx = sum(xs) / n; my = sum(ys) / n
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
out = {}; pc = {}
for lock in ('redlock', 'rslock'):
    cyc = [cycles(f'{D}/log-{lock}-{s}.txt') for s in SECS]
    P = [parse(f'{D}/cg-{lock}-{s}.out') for s in SECS]
    def fit(idx):
        keys = set().union(*[set(p[idx]) for p in P])
        return {('\t'.join(k) if isinstance(k, tuple) else k): slope(cyc, [p[idx].get(k, 0) for p in P]) for k in keys}
    out[lock] = {'self': fit(0), 'edges': fit(1), 'calls': fit(2)}
    tot = [sum(p[0].values()) for p in P]
    out[lock]['total'] = slope(cyc, tot)
    out[lock]['pairs'] = [(tot[1] - tot[0]) / (cyc[1] - cyc[0]), (tot[2] - tot[1]) / (cyc[2] - cyc[1]), (tot[2] - tot[0]) / (cyc[2] - cyc[0])]
    out[lock]['cycles'] = cyc; out[lock]['instr'] = tot
    for kind in ('self', 'incl'):
        L = [load(f'{D}/cg-{lock}-{s}.{kind}.txt') for s in SECS]
        keys = set().union(*[set(l[1]) for l in L])
        pc[f'{lock}-{kind}'] = {'total': slope(cyc, [l[0] for l in L]), 'fn': {k: slope(cyc, [l[1].get(k, 0) for l in L]) for k in keys},
                                'pairs': {k: [(L[1][1].get(k, 0) - L[0][1].get(k, 0)) / (cyc[1] - cyc[0]), (L[2][1].get(k, 0) - L[1][1].get(k, 0)) / (cyc[2] - cyc[1])] for k in keys}}
    print(lock, 'cycles', cyc, 'instr', tot, 'LS slope', round(out[lock]['total']), 'pairs 3-6, 6-10, 3-10', [round(x) for x in out[lock]['pairs']])
json.dump(out, open(f'{D}/edges.json', 'w'))
json.dump(pc, open(f'{D}/percycle.json', 'w'))
