"""Pipeline stage assignment: contiguous min-max partitions of layers into stages.

Two tools:

* `balanced_split` / `min_max_stage_cost`: an exact dynamic programme (vectorised with numpy,
  memoised) for the unconstrained problem. Cheap enough for search inner loops.
* `assign_stages`: the same problem with per-stage memory caps and embedding/head extras on the
  first/last stage, solved with OR-Tools CP-SAT. Use it on the finalists of a search.

For interleaved pipelines callers pass ``num_stages = pp * virtual_stages`` and ``ranks = pp``:
virtual stage ``i`` runs on pp rank ``i % pp``, and `assign_stages` then balances what each
rank holds (its stages summed) and caps each rank's memory, as the cost model charges the
busiest rank (planner.cost.pipeline). Without ``ranks`` every stage is its own rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

import numpy as np

from planner.cost.pipeline import interleaved_chunks
from planner.schema.errors import PlanError

_RESOLUTION = 1_000_000  # integer units per total (cost or memory) in the CP-SAT model


@dataclass
class StageSolution:
    """Result of `assign_stages`. Costs and memory include the first/last-stage extras."""

    ranges: list[tuple[int, int]]
    stage_costs: list[float]
    stage_memory: list[float]
    max_cost: float  # the slowest rank (without `ranks`: the slowest stage)
    optimal: bool  # proven optimal (by the DP shortcut or CP-SAT)
    feasible: bool  # False: memory caps cannot be met (or no solution within the time limit)
    status: str = ""  # "dp" or "even" (the shortcuts), or the CP-SAT status name
    rank_costs: list[float] = field(default_factory=list)  # per rank: its stages' costs summed
    rank_memory: list[float] = field(default_factory=list)


def _check(n: int, num_stages: int) -> None:
    if n < 1:
        raise PlanError("need at least one layer", "layers")
    if not 1 <= num_stages <= n:
        raise PlanError(f"num_stages={num_stages} must be between 1 and the number of layers ({n})",
                        "num_stages")


@lru_cache(maxsize=4096)
def _dp(costs: tuple[float, ...], num_stages: int) -> tuple[float, tuple[tuple[int, int], ...]]:
    """f[k][j] = min over i<j of max(f[k-1][i], sum(costs[i:j])); O(S*L^2) numpy work."""
    n = len(costs)
    _check(n, num_stages)
    p = np.concatenate(([0.0], np.cumsum(np.asarray(costs, dtype=float))))
    seg = p[None, :] - p[:, None]  # seg[i, j] = sum(costs[i:j])
    invalid = np.tril(np.ones((n + 1, n + 1), dtype=bool))  # i >= j: empty stage
    f = np.full(n + 1, np.inf)
    f[0] = 0.0
    back = []
    for _ in range(num_stages):
        cand = np.maximum(f[:, None], seg)
        cand[invalid] = np.inf
        back.append(np.argmin(cand, axis=0))
        f = cand[back[-1], np.arange(n + 1)]
    ranges, j = [], n
    for k in range(num_stages - 1, -1, -1):
        i = int(back[k][j])
        ranges.append((i, j))
        j = i
    return float(f[n]), tuple(reversed(ranges))


def balanced_split(costs: Sequence[float], num_stages: int) -> list[tuple[int, int]]:
    """Split items (in order) into exactly `num_stages` non-empty contiguous [start, end)
    ranges minimising the largest range sum. Exact; memoised on (costs, num_stages)."""
    return list(_dp(tuple(float(c) for c in costs), int(num_stages))[1])


def min_max_stage_cost(costs: Sequence[float], num_stages: int) -> float:
    """The optimum of `balanced_split`: the smallest achievable maximum stage cost."""
    return _dp(tuple(float(c) for c in costs), int(num_stages))[0]


def _per_stage(value: float | Sequence[float], num_stages: int) -> list[float]:
    if isinstance(value, (int, float)):
        return [float(value)] * num_stages
    vals = [float(v) for v in value]
    if len(vals) != num_stages:
        raise PlanError(f"{len(vals)} memory caps for {num_stages} stages", "memory_cap")
    return vals


@dataclass
class _Stages:
    """One stage-assignment problem, in floats: items, per-stage memory caps and the extras
    of each stage (the embedding's on stage 0, the head's on stage S-1)."""

    costs: list[float]
    mem: list[float]
    caps: list[float]  # per rank
    extra_cost: list[float]
    extra_mem: list[float]
    ranks: int  # stage s runs on rank s % ranks (ranks == stages: one stage per rank)

    def groups(self) -> list[list[int]]:
        """The stages of each rank."""
        return [list(range(r, len(self.extra_cost), self.ranks)) for r in range(self.ranks)]

    def solution(self, ranges, optimal: bool, feasible: bool, status: str) -> StageSolution:
        sc = [math.fsum(self.costs[a:b]) + self.extra_cost[s] for s, (a, b) in enumerate(ranges)]
        sm = [math.fsum(self.mem[a:b]) + self.extra_mem[s] for s, (a, b) in enumerate(ranges)]
        rc = [math.fsum(sc[s] for s in g) for g in self.groups()]
        rm = [math.fsum(sm[s] for s in g) for g in self.groups()]
        return StageSolution(list(ranges), sc, sm, max(rc), optimal, feasible, status, rc, rm)

    def meets_caps(self, sol: StageSolution) -> bool:
        return all(m <= c for m, c in zip(sol.rank_memory, self.caps))


def assign_stages(layer_costs: Sequence[float], layer_memory: Sequence[float], num_stages: int,
                  memory_cap: float | Sequence[float], first_extra_cost: float = 0,
                  last_extra_cost: float = 0, first_extra_memory: float = 0,
                  last_extra_memory: float = 0, time_limit_s: float = 5.0,
                  use_dp_shortcut: bool = True, ranks: int | None = None) -> StageSolution:
    """Assign L layers (in order, contiguous, each stage non-empty) to S stages, minimising the
    slowest stage subject to per-stage memory caps. Stage 0 also carries the embedding
    (``first_extra_*``), stage S-1 the output head (``last_extra_*``); with S == 1 both.

    CP-SAT model (`_cp_sat_model`; costs and memory scaled to integers, 1e6 units per total;
    prefix sums are rounded, so each stage sum is within one unit, i.e. ~1e-6 relative, of the
    float value, and caps are given two units of slack so that a stage exactly at its cap is
    not refused):

    * variables: boundaries ``b[0..S]`` with ``b[0] = 0``, ``b[S] = L``, ``b[s] + 1 <= b[s+1]``
      (stage s holds layers ``[b[s], b[s+1])``); ``C[s] = Pc[b[s]]`` and ``M[s] = Pm[b[s]]``
      via element constraints over the integer prefix sums Pc (cost) and Pm (memory); ``z``.
    * constraints: ``C[s+1] - C[s] + extra_cost[s] <= z`` and
      ``M[s+1] - M[s] + extra_mem[s] <= cap[s]`` for every stage with a finite cap.
    * objective: minimise ``z``. ``z >= `` the integer DP optimum (a valid lower bound, since
      memory caps only remove splits); the DP split is given as a hint.

    Because the extras always sit on the first and last layer's stage, the unconstrained problem
    equals `balanced_split` on costs with the extras folded into the first/last layer. If that
    split already meets the caps it is optimal and returned without CP-SAT (``status="dp"``;
    disable with ``use_dp_shortcut=False``). With loose caps CP-SAT reaches the same optimum as
    the DP (to the 1e-6 scaling), which tests/planner/test_stages.py checks.

    Never raises for infeasible caps: returns ``feasible=False`` with the unconstrained DP split
    (also when CP-SAT finds no solution within ``time_limit_s``; see ``status``).

    With ``ranks`` (an interleaved pipeline: ``num_stages`` = ranks x virtual stages) stage s
    runs on rank s % ranks: z bounds each rank's stages summed, ``memory_cap`` is per rank,
    and z >= the total over the ranks. For equal layer costs the unconstrained optimum is known
    (planner.cost.pipeline.interleaved_chunks, the split the cost model charges; ``status=
    "even"``); otherwise CP-SAT solves it from the per-stage DP split as a hint.
    """
    costs = [float(c) for c in layer_costs]
    mem = [float(m) for m in layer_memory]
    n, S = len(costs), int(num_stages)
    _check(n, S)
    if len(mem) != n:
        raise PlanError(f"{len(mem)} memory entries for {n} layers", "layer_memory")
    R = S if ranks is None else int(ranks)
    if R < 1 or S % R:
        raise PlanError(f"{S} stages do not spread evenly over {R} ranks", "ranks")
    caps = _per_stage(memory_cap, R)
    xc = [0.0] * S
    xm = [0.0] * S
    xc[0] += first_extra_cost
    xc[-1] += last_extra_cost
    xm[0] += first_extra_memory
    xm[-1] += last_extra_memory
    problem = _Stages(costs, mem, caps, xc, xm, R)
    ranges, status = _unconstrained(problem, first_extra_cost, last_extra_cost)
    sol = problem.solution(ranges, False, False, "")
    if use_dp_shortcut and status and problem.meets_caps(sol):
        sol.optimal = sol.feasible = True
        sol.status = status
        return sol
    return _solve_cp_sat(problem, first_extra_cost, last_extra_cost, ranges, sol, time_limit_s)


def _unconstrained(p: _Stages, first_extra_cost: float, last_extra_cost: float) -> tuple[list[tuple[int, int]], str]:
    """The split without memory caps and how it was found: "dp" (one stage per rank: the DP on
    costs with the extras folded into the first and last layer), "even" (several stages per
    rank, equal layer costs: planner.cost.pipeline's per-rank optimum), "" (several stages per
    rank, unequal costs: the per-stage DP split, not an optimum; CP-SAT takes it as a hint)."""
    n, S = len(p.costs), len(p.extra_cost)
    folded = list(p.costs)
    folded[0] += first_extra_cost
    folded[-1] += last_extra_cost
    if p.ranks == S:
        return balanced_split(folded, S), "dp"
    c = p.costs[0]
    if c > 0 and all(x == c for x in p.costs):
        sizes = interleaved_chunks(n, p.ranks, S // p.ranks, last_extra_cost / c, first_extra_cost / c)
        bounds = np.concatenate(([0], np.cumsum(sizes))).tolist()
        return list(zip(bounds[:-1], bounds[1:])), "even"
    return balanced_split(folded, S), ""


@dataclass
class _IntegerStages:
    """The problem scaled to integers for CP-SAT (see `assign_stages`)."""

    pc: list[int]  # prefix sums of the layer costs
    pm: list[int]  # prefix sums of the layer memory
    extra_cost: list[int]
    extra_mem: list[int]
    caps: list[int | float]  # per rank: the cap in integer units (with its slack), inf where none
    lower: int  # a lower bound on z: the integer DP optimum (one stage per rank), else total / ranks
    groups: list[list[int]]  # the stages of each rank


def _integer_stages(p: _Stages, first_extra_cost: float, last_extra_cost: float) -> _IntegerStages:
    """Costs scaled to _RESOLUTION units per total cost; memory per the larger of the total
    memory and the largest finite cap."""
    n, S = len(p.costs), len(p.extra_cost)
    sc_ = _RESOLUTION / max(math.fsum(p.costs) + sum(p.extra_cost), 1e-300)
    finite = [c for c in p.caps if math.isfinite(c)]
    sm_ = _RESOLUTION / max(math.fsum(p.mem) + sum(p.extra_mem), *finite, 1e-300)
    pc = [round(v * sc_) for v in np.concatenate(([0.0], np.cumsum(p.costs)))]
    pm = [round(v * sm_) for v in np.concatenate(([0.0], np.cumsum(p.mem)))]
    ifc, ilc = round(first_extra_cost * sc_), round(last_extra_cost * sc_)
    ixc = [(ifc if s == 0 else 0) + (ilc if s == S - 1 else 0) for s in range(S)]
    ixm = [round(v * sm_) for v in p.extra_mem]
    item = [pc[i + 1] - pc[i] for i in range(n)]
    item[0] += ifc
    item[-1] += ilc
    if p.ranks == S:
        lower = int(round(min_max_stage_cost(item, S)))  # exact: integers well below 2**53
    else:
        lower = -(-sum(item) // p.ranks)  # the ranks' loads sum to the total
    # +2 units per stage: the rounded prefix sums and extras can each be off by half a unit, so
    # a stage (or rank) exactly at its cap must not be refused (caps hold to ~2e-6 relative).
    groups = p.groups()
    caps = [round(c * sm_) + 2 * len(g) if math.isfinite(c) else math.inf for c, g in zip(p.caps, groups)]
    return _IntegerStages(pc, pm, ixc, ixm, caps, lower, groups)


def _cp_sat_model(q: _IntegerStages, dp_ranges: list[tuple[int, int]]):
    """(CP-SAT model, its boundary variables b[0..S]); see `assign_stages`."""
    from ortools.sat.python import cp_model

    n, S, pc, pm = len(q.pc) - 1, len(q.extra_cost), q.pc, q.pm
    m = cp_model.CpModel()
    b = [m.NewConstant(0)] + [m.NewIntVar(s, n - S + s, f"b{s}") for s in range(1, S)]
    b.append(m.NewConstant(n))
    C = [m.NewIntVar(0, pc[-1], f"C{s}") for s in range(S + 1)]
    M = [m.NewIntVar(min(pm), max(pm), f"M{s}") for s in range(S + 1)]
    z = m.NewIntVar(q.lower, pc[-1] + sum(q.extra_cost), "z")
    for s in range(S + 1):
        m.AddElement(b[s], pc, C[s])
        m.AddElement(b[s], pm, M[s])
    for s in range(S):
        m.Add(b[s] + 1 <= b[s + 1])
    for g, stages in enumerate(q.groups):  # one stage per rank, or a rank's stages summed
        m.Add(_summed(C[s + 1] - C[s] + q.extra_cost[s] for s in stages) <= z)
        if math.isfinite(q.caps[g]):
            m.Add(_summed(M[s + 1] - M[s] + q.extra_mem[s] for s in stages) <= q.caps[g])
    for s in range(1, S):
        m.AddHint(b[s], dp_ranges[s][0])
    m.Minimize(z)
    return m, b


def _summed(terms):
    """The sum of CP-SAT expressions (one term: that term itself)."""
    it = iter(terms)
    out = next(it)
    for t in it:
        out = out + t
    return out


def _solve_cp_sat(p: _Stages, first_extra_cost: float, last_extra_cost: float, dp_ranges: list[tuple[int, int]],
                  dp_sol: StageSolution, time_limit_s: float) -> StageSolution:
    """CP-SAT's split, or `dp_sol` (infeasible, with the solver's status) when it finds none."""
    from ortools.sat.python import cp_model

    m, b = _cp_sat_model(_integer_stages(p, first_extra_cost, last_extra_cost), dp_ranges)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 2
    solver.parameters.max_time_in_seconds = float(time_limit_s)
    st = solver.Solve(m)
    name = solver.StatusName(st)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        dp_sol.status = name
        return dp_sol
    bounds = [solver.Value(v) for v in b]
    return p.solution(list(zip(bounds[:-1], bounds[1:])), st == cp_model.OPTIMAL, True, name)
