"""Memory probe for any Python command: with MEMPROBE=FILE and this directory on PYTHONPATH, a thread
samples the process's VmRSS every 5 ms; at each new high (+1 MB) it records every thread's stack,
/proc/self/smaps_rollup and, above 90 MB, the ten (MEMPROBE_TOP) largest mappings; the record is written to FILE at
exit (JSON: samples [t, rss, VmHWM so far], highs, hwm: VmHWM at exit). MEMPROBE_TRACE=N also runs
tracemalloc (N frames) and records its largest Python allocations at the highs above 60 MB. Used by archive_memory.py."""
import os, sys, threading, time, json, atexit, traceback
_out = os.environ.get("MEMPROBE")
if _out:
    _t0 = time.monotonic()
    _rec = {"samples": [], "highs": []}
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
                if r > 90e6:
                    try:
                        cur = None
                        with open("/proc/self/smaps") as f:
                            for l in f:
                                p = l.split()
                                if "-" in p[0] and not p[0].endswith(":"):
                                    cur = [p[0], p[5] if len(p) > 5 else "[anon]", 0, 0]
                                    top.append(cur)
                                elif p[0] == "Rss:":
                                    cur[2] = int(p[1]) // 1024
                                elif p[0] == "Anonymous:":
                                    cur[3] = int(p[1]) // 1024
                        top = sorted(top, key=lambda x: -x[2])[:int(os.environ.get("MEMPROBE_TOP", 10))]
                    except OSError:
                        pass
                py = None
                if _trace and r > 60e6 and t - _rec.get("traced", -1) > 0.5:
                    _rec["traced"] = t
                    py = [(str(x.traceback), x.size, x.count) for x in
                          tracemalloc.take_snapshot().statistics("lineno" if _trace == "1" else "traceback")[:15]]
                _rec["highs"].append({"t": round(t, 3), "rss": r, "stacks": st, "smaps": sm, "top": top, "py": py})
            time.sleep(0.005)
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
