#!/usr/bin/env python3
"""Per-cycle instruction counts from two callgrind_annotate listings (short and long run):
(count_long - count_short) / (cycles_long - cycles_short), per function."""
import re, sys, json
LINE = re.compile(r'^\s*([\d,]+)\s+\([ \d.]+%\)\s+(.*)$')
def load(path):
    d = {}
    total = None
    for line in open(path):
        m = LINE.match(line)
        if not m: continue
        n = int(m.group(1).replace(',', ''))
        name = m.group(2).strip()
        if name == 'PROGRAM TOTALS':
            total = n; continue
        # strip "file:" prefix (??? or path) but keep object
        name = re.sub(r'^\S*?:(?=[^:])', '', name, count=1) if not name.startswith('???:') else name[4:]
        d[name] = d.get(name, 0) + n
    return total, d
def cycles(log):
    m = re.search(r'profile: (\d+) ', open(log).read())
    return int(m.group(1))
def percycle(lock, kind, d='/tmp/cgruns2', short=3, long=10):
    ts, s = load(f'{d}/cg-{lock}-{short}.{kind}.txt')
    tl, l = load(f'{d}/cg-{lock}-{long}.{kind}.txt')
    cs, cl = cycles(f'{d}/log-{lock}-{short}.txt'), cycles(f'{d}/log-{lock}-{long}.txt')
    dc = cl - cs
    out = {k: (l.get(k, 0) - s.get(k, 0)) / dc for k in set(s) | set(l)}
    return (tl - ts) / dc, out, (cs, cl, ts, tl)
if __name__ == '__main__':
    res = {}
    for lock in ('redlock', 'rslock'):
        for kind in ('self', 'incl'):
            t, o, meta = percycle(lock, kind)
            res[f'{lock}-{kind}'] = {'total': t, 'meta': meta, 'fn': o}
    json.dump(res, open('/tmp/cgruns2/percycle.json', 'w'))
    for k, v in res.items():
        print(k, round(v['total']), v['meta'])
