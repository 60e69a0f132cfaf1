"""Time travel over the catalog: which snapshot a path like 2026/11/20/web names.

TimeLine's rule, applied per VM: the snapshot used for time t is the latest
one whose timestamp is not after t. A day means its end (the last second of
that local day), so `2026/11/20/web` is web's newest snapshot taken on or
before the 20th. Listings show only what exists (years, months and days
with a snapshot, the HHMMSS of each snapshot of a day); lookups of anything
else that parses as a date or time resolve by the rule, so a day with no
snapshot is reachable without cluttering `ls`.

Days and times are in the local time zone of the mounting host (TZ), the
one its user thinks in; `tz` overrides it (tests use UTC).
"""

import bisect
import datetime as dt
from dataclasses import dataclass, field


@dataclass
class _VMTimes:
    """One VM's snapshots, oldest first, with their local times for bisecting."""

    local: list = field(default_factory=list)
    snaps: list = field(default_factory=list)


class TimeIndex:
    """An immutable index of a catalog's snapshots by local day and time.

    Built once per catalog version (O(n log n)); every listing and lookup
    after that is a dictionary hit or a bisection, so a tree of years of
    nightly snapshots lists at once.
    """

    def __init__(self, snapshots, tz=None):
        self.tz = tz
        self.vms = {}          # name -> _VMTimes
        self.days = {}         # date -> list of snapshots that day, by time
        for s in sorted(snapshots, key=lambda s: (s.time, s.name)):
            t = self.local(s.time)
            v = self.vms.setdefault(s.name, _VMTimes())
            v.local.append(t)
            v.snaps.append(s)
            self.days.setdefault(t.date(), []).append(s)
        self.day_list = sorted(self.days)
        self.years = sorted({d.year for d in self.day_list})
        self.months = {}       # year -> sorted months
        self.mdays = {}        # (year, month) -> sorted days
        for d in self.day_list:
            ms = self.months.setdefault(d.year, [])
            if not ms or ms[-1] != d.month:
                ms.append(d.month)
            self.mdays.setdefault((d.year, d.month), []).append(d.day)

    def local(self, t):
        """A snapshot's aware UTC time as a naive local datetime, whole seconds."""
        return t.astimezone(self.tz).replace(tzinfo=None, microsecond=0)

    # -- listings: only what exists --------------------------------------

    def year_names(self):
        return [f"{y:04d}" for y in self.years]

    def month_names(self, year):
        return [f"{m:02d}" for m in self.months.get(year, ())]

    def day_names(self, year, month):
        return [f"{d:02d}" for d in self.mdays.get((year, month), ())]

    def effective_day(self, day):
        """The newest day on or before `day` that has a snapshot, or None."""
        i = bisect.bisect_right(self.day_list, day)
        return self.day_list[i - 1] if i else None

    def day_listing(self, day):
        """(vm names, HHMMSS names) shown in `YYYY/MM/DD/`.

        A day with snapshots lists the VMs archived that day and one HHMMSS
        per snapshot time; a day without lists the VMs of the day it
        resolves to (the newest earlier day with a snapshot), no times.
        """
        snaps = self.days.get(day)
        if snaps:
            times = sorted({self.local(s.time).strftime("%H%M%S") for s in snaps})
            return sorted({s.name for s in snaps}), times
        eff = self.effective_day(day)
        if eff is None:
            return [], []
        return sorted({s.name for s in self.days[eff]}), []

    def time_listing(self, day, hhmmss):
        """VM names shown in `YYYY/MM/DD/HHMMSS/`: those snapshotted that second."""
        return sorted({s.name for s in self.days.get(day, ()) if self.local(s.time).strftime("%H%M%S") == hhmmss})

    def snapshots_on(self, name, day):
        """`name`'s snapshots taken on local `day`, oldest first."""
        return [s for s in self.days.get(day, ()) if s.name == name]

    # -- lookups: time travel --------------------------------------------

    def at(self, name, until):
        """`name`'s latest snapshot whose local time is not after naive local `until`."""
        v = self.vms.get(name)
        if v is None:
            return None
        i = bisect.bisect_right(v.local, until)
        return v.snaps[i - 1] if i else None

    def at_day(self, name, day):
        return self.at(name, dt.datetime.combine(day, dt.time(23, 59, 59)))

    def latest(self):
        """Each VM's newest snapshot, by name."""
        return {n: v.snaps[-1] for n, v in sorted(self.vms.items())}

    def canonical(self, snap):
        """The immutable path of a snapshot: YYYY/MM/DD/HHMMSS/<vm>."""
        t = self.local(snap.time)
        return f"{t:%Y/%m/%d/%H%M%S}/{snap.name}"


def parse_year(name):
    if len(name) == 4 and name.isdigit() and 1 <= int(name) <= 9999:
        return int(name)
    return None


def parse_month(name):
    if len(name) == 2 and name.isdigit() and 1 <= int(name) <= 12:
        return int(name)
    return None


def parse_day(year, month, name):
    if len(name) == 2 and name.isdigit():
        try:
            return dt.date(year, month, int(name))
        except ValueError:
            return None
    return None


def parse_hhmmss(name):
    if len(name) == 6 and name.isdigit():
        h, m, s = int(name[:2]), int(name[2:4]), int(name[4:])
        if h < 24 and m < 60 and s < 60:
            return dt.time(h, m, s)
    return None


def parse_when(text, tz=None):
    """A user's WHEN as (naive local datetime bound, day, has_time).

    Accepts YYYY-MM-DD, YYYY/MM/DD, YYYY-MM-DDTHH:MM[:SS], "YYYY-MM-DD HH:MM[:SS]",
    YYYY-MM-DDTHHMMSS, and `latest`/`now`. A date alone means the end of that day.
    """
    s = text.strip()
    if s in ("latest", "now"):
        now = dt.datetime.now(dt.timezone.utc).astimezone(tz).replace(tzinfo=None, microsecond=0)
        return now, now.date(), True
    if s == "today":
        today = dt.datetime.now(dt.timezone.utc).astimezone(tz).date()
        return dt.datetime.combine(today, dt.time(23, 59, 59)), today, False
    s2 = s.replace("/", "-").replace(" ", "T")
    date_part, _, time_part = s2.partition("T")
    try:
        day = dt.date.fromisoformat(date_part)
    except ValueError:
        raise ValueError(f"cannot read {text!r} as a date: use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]") from None
    if not time_part:
        return dt.datetime.combine(day, dt.time(23, 59, 59)), day, False
    tp = time_part.replace(":", "")
    if len(tp) == 4:
        tp += "59"
    t = parse_hhmmss(tp)
    if t is None:
        raise ValueError(f"cannot read the time in {text!r}: use HH:MM or HH:MM:SS")
    return dt.datetime.combine(day, t), day, True
