"""Processes kept warm, so that a call starts nothing: sandboxes started ahead of need, and judges kept between
calls. Neither changes what a call gets (see the two classes)."""

from __future__ import annotations

import atexit
import json
import logging
import queue
import sys
import threading

from . import programs
from .bwrap import Limits, spawn, unsafe_mode
from .process import Child

__all__ = ["JUDGES", "shutdown", "start"]

logger = logging.getLogger(__name__)


class _WarmPool:
    """Sandboxes started ahead of need, so that a call does not wait for bubblewrap and Python to start.

    A warm sandbox has received nothing yet: it is exactly what a cold start would give, only earlier. After each
    ``take`` a background thread starts a replacement (at most ``per_key`` idle per set of limits, for the
    ``max_keys`` sets used last). They are started from that long-lived thread on purpose: bwrap's
    ``--die-with-parent`` fires when the *thread* that started it ends, and the code task's worker threads end
    after every batch.
    """

    def __init__(self, per_key: int = 2, max_keys: int = 2):
        self.per_key, self.max_keys = per_key, max_keys
        self.idle: dict[tuple, list[Child]] = {}
        self.lock = threading.Lock()
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def take(self, limits: Limits) -> Child:
        key = (limits, unsafe_mode())
        child = None
        with self.lock:
            waiting = self.idle.pop(key, [])
            while waiting and child is None:
                c = waiting.pop(0)
                if c.alive():
                    child = c
                else:
                    c.kill()
            self.idle[key] = waiting  # re-inserted last: the most recently used set of limits
            if self.thread is None:
                self.thread = threading.Thread(target=self._refill, name="trl-collm-sandbox-pool", daemon=True)
                self.thread.start()
        self.requests.put(key)
        return child if child is not None else spawn(limits)

    def _refill(self) -> None:
        while True:
            key = self.requests.get()
            if key is None:
                return
            with self.lock:
                if len(self.idle.get(key, [])) >= self.per_key or key[1] != unsafe_mode():
                    continue
            try:
                child = spawn(key[0])
            except OSError as err:  # the next take() starts one itself and reports the error there
                logger.debug("sandbox pool: could not start a sandbox: %s", err)
                continue
            evicted = []
            with self.lock:
                self.idle.setdefault(key, []).append(child)
                while len(self.idle) > self.max_keys:
                    evicted += self.idle.pop(next(iter(self.idle)))
            for c in evicted:
                c.kill()

    def close(self) -> None:
        with self.lock:
            idle = [c for waiting in self.idle.values() for c in waiting]
            self.idle = {}
        for c in idle:
            c.kill()


class _Judges:
    """Idle judges kept for the next ``run_tests``: a judge runs only trusted text and starts every problem in a
    fresh namespace, so reusing one is safe; it saves a Python start per problem. A judge that misbehaved (time-out,
    error, unread output) is never reused, and each retires after ``max_uses`` problems."""

    def __init__(self, max_idle: int = 4, max_uses: int = 200):
        self.max_idle, self.max_uses = max_idle, max_uses
        self.idle: list[tuple[int, Child, int]] = []  # (memory_mb, judge, problems judged)
        self.lock = threading.Lock()

    def take(self, memory_mb: int) -> tuple[Child, int]:
        with self.lock:
            for i, (mb, judge, uses) in enumerate(self.idle):
                if mb == memory_mb:
                    del self.idle[i]
                    if judge.alive():
                        return judge, uses
                    judge.kill()
                    break
        argv = [sys.executable, "-I", "-S", "-B", "-c", programs.source("judge"), json.dumps({"memory_mb": memory_mb})]
        return Child(argv), 0

    def give(self, memory_mb: int, judge: Child, uses: int) -> None:
        with self.lock:
            if uses < self.max_uses and len(self.idle) < self.max_idle and judge.alive():
                self.idle.append((memory_mb, judge, uses))
                return
        judge.kill()

    def close(self) -> None:
        with self.lock:
            idle, self.idle = self.idle, []
        for _, judge, _ in idle:
            judge.kill()


JUDGES = _Judges()


_POOL = _WarmPool()


def start(limits: Limits) -> Child:
    """A sandbox running the runner program, waiting for its request line on stdin (a warm one when available)."""
    return _POOL.take(limits)


def shutdown() -> None:
    """End the idle sandboxes and judges kept warm (also done at exit)."""
    _POOL.close()
    JUDGES.close()


atexit.register(shutdown)
