"""Each VM's health at a glance: its last good archive, how old that is, its last error.

One reading for `foundation status` and for the notifications, so the
desktop pop-up and the terminal never disagree. The last good archive is
the newer of the journal's last successful run and the catalog's newest
snapshot of that name: the journal needs no store (the disk may be the
thing that is missing), the catalog knows runs the journal has since
overwritten with a failure.
"""

from datetime import datetime, timedelta, timezone

from foundation.fields import Fields

GOOD = ("ok", "unchanged")
DEFAULT_STALE = timedelta(days=2)


class Health(Fields):
    def __init__(self, name, status=None, last_run=None, error=None, last_good=None, interrupted=None):
        self.name = name
        self.status = status            # the last run's: ok, unchanged, failed, skipped; None: never run
        self.last_run = last_run        # when the last run finished (datetime)
        self.error = error              # the last run's error
        self.last_good = last_good      # the newest archive known to be good (datetime)
        self.interrupted = interrupted  # the step an interrupted run stopped at

    def age(self, now=None):
        if self.last_good is None:
            return None
        return (now or datetime.now(timezone.utc)) - self.last_good

    def stale(self, max_age=DEFAULT_STALE, now=None):
        """True when the last good archive is older than max_age (or there never was one after a run)."""
        age = self.age(now)
        return age > max_age if age is not None else self.status is not None

    def failed(self):
        return self.status is not None and self.status not in GOOD

    def to_json(self, now=None):
        age = self.age(now)
        return {"name": self.name, "status": self.status, "last_run": _iso(self.last_run),
                "error": self.error, "last_good": _iso(self.last_good),
                "age_seconds": int(age.total_seconds()) if age is not None else None,
                "interrupted": self.interrupted}


def health(name, rec, latest=None):
    """The Health of VM `name` from its journal record (or None) and its newest catalog snapshot time."""
    h = Health(name, last_good=latest)
    last = (rec or {}).get("last") or {}
    if last:
        h.status, h.error = last.get("status"), last.get("error")
        h.last_run = parse_time(last.get("finished"))
        if h.status in GOOD and h.last_run and (h.last_good is None or h.last_run > h.last_good):
            h.last_good = h.last_run
    run = (rec or {}).get("run")
    if run:
        h.interrupted = run.get("step")
    return h


def human_age(age):
    """'3 days', '5 hours', '12 minutes'."""
    s = int(age.total_seconds())
    for unit, n in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if s >= n:
            k = s // n
            return f"{k} {unit}{'s' if k > 1 else ''}"
    return "moments"


def parse_time(t):
    if not t:
        return None
    t = datetime.fromisoformat(t) if isinstance(t, str) else t
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _iso(t):
    return t.astimezone(timezone.utc).isoformat(timespec="seconds") if t else None
