#!/usr/bin/env python3
"""Sum the file syscalls of a `strace -f -T -tt` log by call and file kind: count, seconds, and how many took > 1 ms.

Used to see where a cold import waits:
    strace -f -T -tt -o LOG -e trace=openat,pread64,preadv2,read,fsync,fdatasync,pwrite64,sync_file_range,fadvise64 python3 -m foundation ...
    python3 benchmarks/strace_waits.py LOG
"""
import re, sys, collections
fds = {}
st = collections.defaultdict(lambda: [0, 0.0, 0])
for l in open(sys.argv[1]):
    m = re.match(r'(\d+) [\d:.]+ (\w+)\((.*)<([\d.]+)>$', l)
    if not m:
        continue
    pid, call, args, dur = m.groups()
    dur = float(dur)
    if call == 'openat':
        r = re.search(r'= (\d+)', args)
        if r:
            fds[r.group(1)] = args.split('"')[1]
        continue
    if call not in ('pread64', 'preadv2', 'preadv', 'read', 'fsync', 'fdatasync', 'pwrite64', 'pwritev', 'sync_file_range', 'fadvise64'):
        continue
    p = fds.get(args.split(',')[0].strip(), '?')
    if '/store' not in p and '/s/' not in p and 'arena' not in p and not p.endswith('.raw'):
        continue
    kind = 'image' if p.endswith('.raw') else re.sub(r'\d{8}', 'N', p.split('/')[-1])
    k = (call, kind)
    st[k][0] += 1; st[k][1] += dur; st[k][2] += dur > 0.001
tot = sum(v[1] for k, v in st.items() if k[1] != 'image')
for k, v in sorted(st.items(), key=lambda x: -x[1][1]):
    print(f'{v[1]:7.3f}s {v[0]:5d} calls {v[2]:4d} >1ms  {k}')
print(f'store syscalls total {tot:.3f}s')
