"""Running a replica's transfers a few at a time: threads, since each one waits on the network.

One helper for both levels of parallelism (several objects of a
replicate, several parts of one large S3 object): the caller sees results
in the order they finish, and the first failure stops the rest, so a
caller that commits something afterwards (the manifest) never does so
over an object that did not arrive.
"""

from concurrent.futures import ThreadPoolExecutor, as_completed


def run_all(fn, jobs, workers):
    """Yield fn(*job) for every job, at most `workers` at once, in the order they finish.

    The first exception, or the caller closing the generator (its own
    exception), cancels the jobs not yet started and waits for those
    running; the exception then goes on to the caller. One worker, or one
    job, runs in the caller's thread.
    """
    jobs = list(jobs)
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield fn(*job)
        return
    with ThreadPoolExecutor(min(workers, len(jobs)), thread_name_prefix="replica") as ex:
        futures = [ex.submit(fn, *job) for job in jobs]
        try:
            for f in as_completed(futures):
                yield f.result()
        finally:
            for f in futures:
                f.cancel()
