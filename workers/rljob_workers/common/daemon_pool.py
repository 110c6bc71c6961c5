"""A thread pool for the user's synchronous functions (reward rules, environment steps) whose threads never
hold their process at exit.

The standard library's ThreadPoolExecutor joins its threads when the interpreter exits: a user function that
never returns (a `time.sleep(3600)`, a request with no timeout) then keeps its replica's process alive after
Ray has killed it, for ever (seen: a reward replica left behind by `rljob run`). The call's own deadline
already answered for it; nothing waits for its thread, so these threads are daemons.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")
IDLE_SECONDS = 5.0  # a thread without work this long ends


class DaemonThreadPool(Executor):
    """Up to `max_workers` daemon threads, started as work comes; `submit` as ThreadPoolExecutor's."""

    def __init__(self, max_workers: int, thread_name_prefix: str = "daemon-pool") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        self.max_workers, self.prefix = max_workers, thread_name_prefix
        self._work: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None]
        self._work = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._shut = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot submit to a pool that was shut down")
            self._work.put((future, fn, args, kwargs))
            if self._idle == 0 and len(self._threads) < self.max_workers:  # none free to take it: one more
                name = f"{self.prefix}_{len(self._threads)}"
                thread = threading.Thread(target=self._worker, name=name, daemon=True)
                self._threads.append(thread)
                self._idle += 1
                thread.start()
        return future

    def _worker(self) -> None:
        """Runs work until the pool shuts down, or until it has had none for IDLE_SECONDS (a pool left
        unused holds no threads)."""
        me = threading.current_thread()
        while True:
            try:
                item = self._work.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if not self._work.empty():  # work came as the wait ended: take it
                        continue
                    self._idle -= 1
                    self._threads.remove(me)
                    return
            with self._lock:
                self._idle -= 1
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # the caller's to see, as ThreadPoolExecutor reports it
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more work; with `cancel_futures`, queued work is cancelled. Threads still running a function are
        left to it (they are daemons); `wait` waits for the others."""
        with self._lock:
            self._shut = True
            threads = list(self._threads)
        if cancel_futures:
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._work.put(None)
        if wait:
            for thread in threads:
                thread.join()
