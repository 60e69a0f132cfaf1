"""Memory probe for any Python command: with MEMPROBE=FILE and this directory on PYTHONPATH, a thread
samples the process's VmRSS every 5 ms; at each new high (+1 MB) it records every thread's stack,
/proc/self/smaps_rollup and, above 90 MB (MEMPROBE_TOP_MB), the ten (MEMPROBE_TOP) largest mappings and the
RSS per mapped file (by_name: name, maps, Rss, Anonymous, Private_Dirty, in kB); the record is written to FILE at
exit (JSON: samples [t, rss, VmHWM so far], highs, hwm: VmHWM at exit). MEMPROBE_TRACE=N also runs
tracemalloc (N frames) and records its largest Python allocations at the highs above 60 MB; MEMPROBE_MODULES=1 the
names of the modules loaded at each high. Used by archive_memory.py."""
import os, sys, threading, time, json, atexit, traceback
_out = os.environ.get("MEMPROBE")
if _out:
    _t0 = time.monotonic()
    _rec = {"samples": [], "highs": []}
    _top_from = float(os.environ.get("MEMPROBE_TOP_MB", "90")) * 1e6
    def _rss():
        with open("/proc/self/status") as f:
            for l in f:
                if l.startswith("VmHWM"):
                    _rec["hwm"] = int(l.split()[1]) * 1024  # the exact peak: a spike between samples too
                elif l.startswith("VmRSS"):
                    return int(l.split()[1]) * 1024
    def _loop():
        hi = 0
        n = 0
        me = threading.get_ident()
        while True:
            r = _rss()
            t = time.monotonic() - _t0
            n += 1
            if n % 4 == 0:
                _rec["samples"].append((round(t, 3), r, _rec["hwm"]))
            if r > hi + (1 << 20):
                hi = r
                names = {th.ident: th.name for th in threading.enumerate()}
                st = {}
                for tid, fr in sys._current_frames().items():
                    if tid == me:
                        continue
                    st[names.get(tid, str(tid))] = [f"{fs.filename.split('/foundation/')[-1]}:{fs.lineno} {fs.name}" for fs in traceback.extract_stack(fr)[-8:]]
                sm = {}
                try:
                    with open("/proc/self/smaps_rollup") as f:
                        for l in f:
                            k = l.split(":")[0]
                            if k in ("Rss", "Anonymous", "Shared_Clean", "Private_Clean", "Private_Dirty"):
                                sm[k] = int(l.split()[1]) // 1024
                except OSError:
                    pass
                top = []
                if r > _top_from:
                    try:
                        cur = None
                        with open("/proc/self/smaps") as f:
                            for l in f:
                                p = l.split()
                                if "-" in p[0] and not p[0].endswith(":"):
                                    cur = [p[0], p[5] if len(p) > 5 else "[anon]", 0, 0, 0]
                                    top.append(cur)
                                elif p[0] == "Rss:":
                                    cur[2] = int(p[1])
                                elif p[0] == "Anonymous:":
                                    cur[3] = int(p[1])
                                elif p[0] == "Private_Dirty:":
                                    cur[4] = int(p[1])
                        agg = {}
                        for m in top:
                            a = agg.setdefault(m[1], [0, 0, 0, 0])
                            a[0] += 1
                            a[1] += m[2]
                            a[2] += m[3]
                            a[3] += m[4]
                        _rec.setdefault("by_name", {})[str(round(t, 3))] = sorted(
                            ([k, *v] for k, v in agg.items() if v[1]), key=lambda x: -x[2])
                        top = sorted(top, key=lambda x: -x[2])[:int(os.environ.get("MEMPROBE_TOP", 10))]
                    except OSError:
                        pass
                py = None
                if _trace and r > 60e6 and t - _rec.get("traced", -1) > 0.5:
                    _rec["traced"] = t
                    py = [(str(x.traceback), x.size, x.count) for x in
                          tracemalloc.take_snapshot().statistics("lineno" if _trace == "1" else "traceback")[:15]]
                mods = sorted(sys.modules) if _mods else None
                _rec["highs"].append({"t": round(t, 3), "rss": r, "stacks": st, "smaps": sm, "top": top, "py": py,
                                      "modules": mods})
            time.sleep(0.005)
    _mods = os.environ.get("MEMPROBE_MODULES")  # also the names of the modules loaded at each high
    _trace = os.environ.get("MEMPROBE_TRACE")  # also tracemalloc's top lines (slow: Python objects only)
    if _trace:
        import tracemalloc
        tracemalloc.start(int(_trace))
    threading.Thread(target=_loop, daemon=True, name="memprobe").start()
    def _dump():
        _rss()
        with open(_out, "w") as f:
            json.dump(_rec, f)
    atexit.register(_dump)
