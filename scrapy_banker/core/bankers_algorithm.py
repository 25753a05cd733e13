"""Banker's algorithm: admit concurrent crawl work only into safe states.

The paper (王庆红 et al., 2015) keeps four structures -- the available vector
``Av``, the maximum-claim matrix ``M``, the allocation matrix ``Al`` and the
need matrix ``N = M - Al`` -- and grants a request ``R`` of process ``i`` in
four steps: (a) ``R <= N_i`` or the request is an error; (b) ``R <= Av`` or
the process waits; (c) a trial allocation ``Av -= R, Al_i += R, N_i -= R``;
(d) the safety check: a state is safe when the processes can be ordered so
that each one's remaining need fits in what is free once the previous ones
finished and released everything.  An unsafe trial is rolled back and the
process waits.

A crawl's "processes" are tasks (a login session, a browser page held across
a chain of requests, a sticky proxy) and its resources are download slots,
browser pages, proxies...  The paper's safety check rescans every process for
every one it retires: O(m·n²).  :meth:`BankersState.is_safe` sorts each
resource's needs once and advances one pointer per resource instead
(Habermann's method): every process is visited once per resource type, so a
check costs O(m·n log n) for the sorts plus O(m·n) numpy work.

Pure: numpy only, no Scrapy, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "BankersState",
    "Decision",
    "naive_safe_sequence",
]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Decision:
    """Outcome of a request: granted, or why the process must wait."""

    granted: bool
    #: "granted", "insufficient" (step b: not enough free now) or "unsafe" (step d).
    reason: str

    def __bool__(self) -> bool:
        return self.granted


def naive_safe_sequence(
    available: Sequence[int], allocation: Sequence[Sequence[int]], need: Sequence[Sequence[int]]
) -> list[int] | None:
    """The paper's safety algorithm, verbatim (steps a-d); the reference for tests.

    Returns a safe sequence of row indices, or ``None`` when the state is unsafe.
    """
    work = list(available)
    n = len(allocation)
    finish = [False] * n
    order: list[int] = []
    progress = True
    while progress:
        progress = False
        for i in range(n):  # b) find i with Finish[i] = false and Need_i <= Work
            if not finish[i] and all(nd <= w for nd, w in zip(need[i], work, strict=True)):
                work = [w + a for w, a in zip(work, allocation[i], strict=True)]  # c)
                finish[i] = True
                order.append(i)
                progress = True
    return order if all(finish) else None  # d)


class BankersState:
    """Resources, processes' maximum claims and allocations; grants only safe requests.

    Process ids are any hashable (a task name, a request fingerprint...).
    Vectors are given as mappings ``{resource: amount}``; missing resources
    count as 0.  All amounts are non-negative integers.
    """

    def __init__(self, totals: Mapping[str, int]) -> None:
        if not totals:
            raise ValueError("BankersState needs at least one resource type")
        self.resources: tuple[str, ...] = tuple(totals)
        self._index = {name: i for i, name in enumerate(self.resources)}
        self.total: IntArray = self._vector(totals, "total")
        self.available: IntArray = self.total.copy()
        m = len(self.resources)
        self._rows: dict[Hashable, int] = {}
        self._free_rows: list[int] = []
        self._max: IntArray = np.zeros((0, m), dtype=np.int64)
        self._alloc: IntArray = np.zeros((0, m), dtype=np.int64)
        self._live: npt.NDArray[np.bool_] = np.zeros(0, dtype=bool)
        self.checks = 0

    # -- vectors --------------------------------------------------------------

    def _vector(self, amounts: Mapping[str, int], what: str) -> IntArray:
        if not isinstance(amounts, Mapping):
            raise ValueError(f"{what} must be a mapping of resource -> amount, got {amounts!r}")
        vec = np.zeros(len(self.resources), dtype=np.int64)
        for name, amount in amounts.items():
            i = self._index.get(name)
            if i is None:
                raise ValueError(
                    f"{what}: unknown resource {name!r}; known: {list(self.resources)}"
                )
            if isinstance(amount, bool) or not isinstance(amount, (int, np.integer)):
                raise ValueError(f"{what}[{name!r}] must be an integer, got {amount!r}")
            if amount < 0:
                raise ValueError(f"{what}[{name!r}] must be >= 0, got {amount}")
            vec[i] = int(amount)
        return vec

    def as_dict(self, vec: IntArray) -> dict[str, int]:
        return {name: int(vec[i]) for i, name in enumerate(self.resources)}

    # -- processes ----------------------------------------------------------------

    def __contains__(self, pid: object) -> bool:
        return pid in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def pids(self) -> list[Hashable]:
        return list(self._rows)

    def add_process(self, pid: Hashable, max_claim: Mapping[str, int]) -> None:
        """Declare a process and its maximum claim (the ``M`` row)."""
        if pid in self._rows:
            raise ValueError(f"process {pid!r} is already declared")
        claim = self._vector(max_claim, f"max claim of {pid!r}")
        over = claim > self.total
        if over.any():
            name = self.resources[int(np.argmax(over))]
            raise ValueError(
                f"max claim of {pid!r} asks {int(claim[self._index[name]])} {name!r}, "
                f"more than the total {int(self.total[self._index[name]])}: it could never run"
            )
        if self._free_rows:
            row = self._free_rows.pop()
        else:
            row = len(self._live)
            grow = max(16, row)
            m = len(self.resources)
            self._max = np.vstack([self._max, np.zeros((grow, m), dtype=np.int64)])
            self._alloc = np.vstack([self._alloc, np.zeros((grow, m), dtype=np.int64)])
            self._live = np.concatenate([self._live, np.zeros(grow, dtype=bool)])
            self._free_rows.extend(range(row + grow - 1, row, -1))
        self._max[row] = claim
        self._alloc[row] = 0
        self._live[row] = True
        self._rows[pid] = row

    def _row(self, pid: Hashable) -> int:
        try:
            return self._rows[pid]
        except KeyError:
            raise KeyError(f"unknown process {pid!r}: declare it with add_process first") from None

    def allocation_of(self, pid: Hashable) -> dict[str, int]:
        return self.as_dict(self._alloc[self._row(pid)])

    def need_of(self, pid: Hashable) -> dict[str, int]:
        row = self._row(pid)
        return self.as_dict(self._max[row] - self._alloc[row])

    def max_of(self, pid: Hashable) -> dict[str, int]:
        return self.as_dict(self._max[self._row(pid)])

    def need_total(self) -> dict[str, int]:
        """Every process's need summed (claims minus allocations): what may still be asked.

        For telemetry: rows of finished processes are zero, so one vector sum
        over the matrix is exact, without a loop over processes.
        """
        return self.as_dict((self._max - self._alloc).sum(axis=0))

    # -- the algorithm ----------------------------------------------------------------

    def request(
        self, pid: Hashable, amounts: Mapping[str, int], *, check_safety: bool = True
    ) -> Decision:
        """Steps a-d: grant ``amounts`` to ``pid`` only if the result is safe.

        ``check_safety=False`` skips step d: first come, first served, the
        naive allocator the paper compares against (it can deadlock).
        """
        row = self._row(pid)
        req = self._vector(amounts, f"request of {pid!r}")
        need = self._max[row] - self._alloc[row]
        if (req > need).any():  # a)
            i = int(np.argmax(req > need))
            raise ValueError(
                f"request of {pid!r} asks {int(req[i])} {self.resources[i]!r} but its "
                f"declared need is {int(need[i])} (max claim {int(self._max[row, i])}, "
                f"holding {int(self._alloc[row, i])})"
            )
        if (req > self.available).any():  # b)
            return Decision(False, "insufficient")
        self.available -= req  # c)
        self._alloc[row] += req
        if not check_safety or self.is_safe():  # d)
            return Decision(True, "granted")
        self.available += req
        self._alloc[row] -= req
        return Decision(False, "unsafe")

    def release(self, pid: Hashable, amounts: Mapping[str, int]) -> None:
        row = self._row(pid)
        rel = self._vector(amounts, f"release of {pid!r}")
        held = self._alloc[row]
        if (rel > held).any():
            i = int(np.argmax(rel > held))
            raise ValueError(
                f"release of {pid!r} returns {int(rel[i])} {self.resources[i]!r} "
                f"but it holds {int(held[i])}"
            )
        self._alloc[row] -= rel
        self.available += rel

    def finish(self, pid: Hashable) -> dict[str, int]:
        """The process is done: release everything it holds and forget it."""
        row = self._row(pid)
        held = self._alloc[row].copy()
        self.available += held
        self._alloc[row] = 0
        self._max[row] = 0
        self._live[row] = False
        del self._rows[pid]
        self._free_rows.append(row)
        return self.as_dict(held)

    def is_safe(self) -> bool:
        return self._safe_count() == len(self._rows)

    def _safe_count(self) -> int:
        """How many live processes the sorted-pointer sweep can retire.

        For each resource, processes are sorted by their need of it; a pointer
        per resource moves past every process whose need fits in the current
        work vector.  A process passed by all m pointers can finish: its
        allocation joins the work vector, which may move pointers further.
        """
        self.checks += 1
        live = np.flatnonzero(self._live)
        n = len(live)
        if n == 0:
            return 0
        alloc = self._alloc[live]
        need = self._max[live] - alloc
        work = self.available.copy()
        m = len(self.resources)
        orders = np.argsort(need, axis=0, kind="stable")  # (n, m)
        sorted_needs = np.take_along_axis(need, orders, axis=0)
        passed = np.zeros(n, dtype=np.int64)
        ptr = [0] * m
        done = 0
        progress = True
        while progress and done < n:
            progress = False
            for r in range(m):
                k = int(np.searchsorted(sorted_needs[:, r], work[r], side="right"))
                if k <= ptr[r]:
                    continue
                rows = orders[ptr[r] : k, r]
                ptr[r] = k
                passed[rows] += 1
                ready = rows[passed[rows] == m]
                if ready.size:
                    work += alloc[ready].sum(axis=0)
                    done += int(ready.size)
                    progress = True
        return done

    def safe_sequence(self) -> list[Hashable] | None:
        """A safe order of the processes (for explanations), or None."""
        pids = list(self._rows)
        rows = [self._rows[p] for p in pids]
        alloc = self._alloc[rows].tolist()
        need = (self._max[rows] - self._alloc[rows]).tolist()
        order = naive_safe_sequence(self.available.tolist(), alloc, need)
        return None if order is None else [pids[i] for i in order]

    # -- observability ---------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Available, and per process allocation / need / max: JSON-friendly."""
        return {
            "total": self.as_dict(self.total),
            "available": self.as_dict(self.available),
            "processes": {
                str(pid): {
                    "max": self.as_dict(self._max[row]),
                    "allocation": self.as_dict(self._alloc[row]),
                    "need": self.as_dict(self._max[row] - self._alloc[row]),
                }
                for pid, row in self._rows.items()
            },
        }

    def format(self, limit: int = 20) -> str:
        """The state as the paper's tables: Available, then Max / Allocation / Need rows."""
        names = self.resources
        width = max(6, *(len(n) for n in names))
        head = " ".join(f"{n:>{width}}" for n in names)
        lines = [f"{'':<16} {head}", f"{'total':<16} " + self._fmt(self.total, width)]
        lines.append(f"{'available':<16} " + self._fmt(self.available, width))
        for k, (pid, row) in enumerate(self._rows.items()):
            if k == limit:
                lines.append(f"... {len(self._rows) - limit} more processes")
                break
            label = str(pid)[:16]
            lines.append(f"{label:<16} max   " + self._fmt(self._max[row], width))
            lines.append(f"{'':<16} alloc " + self._fmt(self._alloc[row], width))
            lines.append(f"{'':<16} need  " + self._fmt(self._max[row] - self._alloc[row], width))
        return "\n".join(lines)

    @staticmethod
    def _fmt(vec: Iterable[Any], width: int) -> str:
        return " ".join(f"{int(v):>{width}}" for v in vec)
