"""Running a replica's transfers a few at a time: threads, since each one waits on the network.

One helper for both levels of parallelism (the objects of a replicate,
started as soon as each is checked, and the parts of one large S3
object): results come in the order the transfers finish, and the first
failure stops the rest, so a caller that commits something afterwards
(the manifest) never does so over an object that did not arrive.
"""

from concurrent.futures import ThreadPoolExecutor, as_completed


class Pipeline:
    """Jobs fn(*job) started as they are added, at most `workers` at once (one worker: run later,
    in the caller's thread, by results()).

    add() raises the first failure of a job already done; results() yields every result in the
    order they finish, or raises the first failure. Leaving the `with` block cancels the jobs not
    yet started and waits for those running.
    """

    def __init__(self, fn, workers):
        self.fn = fn
        self.ex = ThreadPoolExecutor(workers, thread_name_prefix="replica") if workers > 1 else None
        self.futures, self.jobs, self.failed = [], [], None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.ex is not None:
            for f in self.futures:
                f.cancel()
            self.ex.shutdown(wait=True)

    def _done(self, f):
        if not f.cancelled() and f.exception() is not None and self.failed is None:
            self.failed = f.exception()

    def add(self, *job):
        if self.failed is not None:
            raise self.failed
        if self.ex is None:
            self.jobs.append(job)
            return
        f = self.ex.submit(self.fn, *job)
        f.add_done_callback(self._done)
        self.futures.append(f)

    def results(self):
        if self.ex is None:
            for job in self.jobs:
                yield self.fn(*job)
            return
        for f in as_completed(self.futures):
            yield f.result()


def gather(calls, workers):
    """[call() for call in calls], at most `workers` at once (independent requests: one round trip
    for all of them on a long link); the first failure, in order, is raised."""
    if workers <= 1 or len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(min(workers, len(calls)), thread_name_prefix="replica") as ex:
        futures = [ex.submit(call) for call in calls]
        return [f.result() for f in futures]


def begun(fn, *args, now=True):
    """fn(*args) started in a thread of its own (`now`), or run at once in this one -> wait(), which
    returns its result or raises its failure (each time it is called)."""
    if not now:
        out = fn(*args)
        return lambda: out
    ex = ThreadPoolExecutor(1, thread_name_prefix="replica")
    future = ex.submit(fn, *args)
    ex.shutdown(wait=False)
    return future.result


def run_all(fn, jobs, workers):
    """Yield fn(*job) for every job, at most `workers` at once, in the order they finish (Pipeline)."""
    with Pipeline(fn, workers) as p:
        for job in jobs:
            p.add(*job)
        yield from p.results()
