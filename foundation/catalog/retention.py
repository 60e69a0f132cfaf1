"""Retention policies: which snapshots `foundation prune` keeps.

The rules are restic's, applied to each name on its own: `keep_daily N`
keeps the newest snapshot of each of the N most recent days that have a
snapshot of that name (likewise ISO weeks, months, years), `keep_last N`
the N newest snapshots. The rules are independent and their union is
kept: a snapshot kept by several rules counts in each (unlike borg, where
a period already covered by an earlier rule does not use up a later
rule's count). The newest snapshot of every name is always kept, whatever
the policy says, so prune can never empty a name.

Days, weeks, months and years are those of the local time zone (TZ), the
same days the /snapshot/YYYY/MM/DD tree shows (snapshotfs.timeindex), so
`keep_daily` keeps exactly one entry per day directory a user sees; `tz`
overrides it (tests use fixed zones).
"""

from dataclasses import dataclass, field, fields

from foundation.config import ConfigError

# rule -> (period of a local datetime, how a period is written)
PERIODS = {
    "daily": (lambda t: t.date(), lambda p: p.isoformat()),
    "weekly": (lambda t: t.isocalendar()[:2], lambda p: f"{p[0]:04d}-W{p[1]:02d}"),
    "monthly": (lambda t: (t.year, t.month), lambda p: f"{p[0]:04d}-{p[1]:02d}"),
    "yearly": (lambda t: t.year, lambda p: f"{p:04d}"),
}
KEYS = ("keep_last", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly")


@dataclass(frozen=True)
class Policy:
    """How many of each kind to keep; 0 turns a rule off."""

    last: int = 0
    daily: int = 0
    weekly: int = 0
    monthly: int = 0
    yearly: int = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if type(v) is not int or v < 0:
                raise ValueError(f"keep_{f.name} must be a non-negative integer, not {v!r}")

    @property
    def empty(self):
        """True when no rule keeps anything (prune would keep only each name's newest)."""
        return not any(getattr(self, f.name) for f in fields(self))

    def describe(self):
        on = [f"--keep-{f.name} {getattr(self, f.name)}" for f in fields(self) if getattr(self, f.name)]
        return " ".join(on) if on else "no rule"

    @classmethod
    def from_config(cls, table, path="(config)"):
        """The `[retention]` table of the config file -> Policy; ConfigError naming a bad key."""
        if not isinstance(table, dict):
            raise ConfigError(path, "[retention] must be a table")
        kw = {}
        for key, value in table.items():
            if key not in KEYS:
                raise ConfigError(path, f"unknown setting {key!r} in [retention] (known: {', '.join(KEYS)})")
            if type(value) is not int or value < 0:
                raise ConfigError(path, f"[retention] {key} must be a non-negative integer, not {value!r}")
            kw[key[len("keep_"):]] = value
        return cls(**kw)


@dataclass
class Decision:
    """One snapshot's fate: kept (with every rule that keeps it) or forgotten."""

    snapshot: object
    reasons: list = field(default_factory=list)  # e.g. ["newest", "daily 2024-05-03", "weekly 2024-W18"]

    @property
    def keep(self):
        return bool(self.reasons)


def decide(snapshots, policy, tz=None):
    """Apply `policy` to each name's snapshots -> [Decision], oldest first (by time, then id)."""
    by_name = {}
    for s in snapshots:
        by_name.setdefault(s.name, []).append(s)
    out = []
    for snaps in by_name.values():
        out += _decide_one(sorted(snaps, key=lambda s: (s.time, s.id)), policy, tz)
    return sorted(out, key=lambda d: (d.snapshot.time, d.snapshot.id))


def _decide_one(snaps, policy, tz):
    """One name's snapshots, oldest first -> decisions in the same order."""
    decisions = [Decision(s) for s in snaps]
    newest_first = decisions[::-1]
    if newest_first:
        newest_first[0].reasons.append("newest")
    for i, d in enumerate(newest_first[:policy.last]):
        d.reasons.append(f"last {i + 1}")
    for rule, (period_of, show) in PERIODS.items():
        budget = getattr(policy, rule)
        seen = None
        for d in newest_first:
            if budget == 0:
                break
            p = period_of(d.snapshot.time.astimezone(tz))
            if p != seen:  # the newest snapshot of a period not seen yet
                seen = p
                d.reasons.append(f"{rule} {show(p)}")
                budget -= 1
    return decisions
