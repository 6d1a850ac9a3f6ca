"""One serving experiment, as Chaos Toolkit reads it: steady state, method, rollbacks, journal.

A steady-state hypothesis (success rate and p99, with tolerances) is checked before, during and
after; the method is bounded load phases with faults put in and taken out; rollbacks always run
(every fault removed, the proxy and the server the experiment started stopped, their ports checked
closed); and a journal records it all. A safeguard aborts the experiment (load stopped, every fault
removed) when the SLO is breached for N consecutive windows in a phase where it should hold.

The parts live next door: :mod:`.spec` (parameters), :mod:`.budget` (the ledger in the transport),
:mod:`.windows` (SLO windows), :mod:`.deployment` (server and proxy), :mod:`.payloads` (traffic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import platform
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from mmchaos import __version__
from mmchaos.chaos.budget import ErrorInspector, RequestLedger, budgeted_transports
from mmchaos.chaos.deployment import Deployment
from mmchaos.chaos.payloads import good_mix, traffic
from mmchaos.chaos.promql_probe import PromQLProbes, describe_failures
from mmchaos.chaos.sequential import stop_when_decided
from mmchaos.chaos.spec import ExperimentContext, ServingParams
from mmchaos.chaos.steady import explain_unmet
from mmchaos.chaos.windows import Phase, WindowTracker
from mmchaos.net import CLIENT_KEEPALIVE_EXPIRY
from mmchaos.targets.base import Target

if TYPE_CHECKING:
    import ssl

    from mmchaos.chaos.load import LoadResult, PayloadMix, RequestRecord

__all__ = ["Experiment", "jsonable"]

log = logging.getLogger(__name__)


def _now_iso() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


class Experiment:
    """One Chaos Toolkit-style experiment against a deployment; a context manager whose exit is the
    rollback (it always runs).

    ``phase()`` runs bounded load; ``steady_state()`` is a guarded phase judged against the SLO;
    ``recover()`` measures how long the SLO takes to hold again; ``abort()`` stops everything.
    """

    def __init__(
        self,
        ctx: ExperimentContext,
        params: ServingParams,
        *,
        title: str,
        description: str,
        proxy: bool = True,
        served: Target | None = None,
        resend_stale: bool = False,
    ) -> None:
        self.ctx = ctx
        self.resend_stale = resend_stale
        """Load requests lost on a kept-alive connection the server had closed are sent again
        (:class:`~mmchaos.keepalive.WireTrace`); off where connection faults are what is injected."""
        self.params = params
        self.slo = params.slo
        self.title = title
        seed_rng = ctx.rng("experiment")
        self.seed = int(seed_rng.integers(0, 2**31 - 1))
        self.dep = Deployment(
            ctx.target,
            params.server,
            proxy=proxy,
            seed=self.seed,
            loopback_only=params.budget.loopback_only,
            served=served,
            resources=getattr(ctx, "resources", None),
        )
        self.ledger = RequestLedger(params.budget)
        self.inspector = ErrorInspector()
        self.aborted: str | None = None
        self.interrupted: str | None = None
        self.phases: list[Phase] = []
        self._phase_no = 0
        self._t0 = time.monotonic()
        self._mix: PayloadMix | None = None
        self._tls: ssl.SSLContext | None = None
        self.teardown: dict[str, Any] = {}
        self.promql: PromQLProbes | None = None
        self.journal: dict[str, Any] = {
            "mmchaos-version": __version__,
            "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
            "python": sys.version.split()[0],
            "node": platform.node(),
            "experiment": {
                "title": title,
                "description": description,
                "seed": self.seed,
                "run_seed": ctx.seed,
                "steady-state-hypothesis": {
                    "title": "the service answers within its SLO",
                    "probes": [
                        {"name": "success-rate", "tolerance": {"min": params.slo.min_success_rate}},
                        {"name": "p99-latency-ms", "tolerance": {"max": params.slo.p99_ms}},
                    ],
                    "window_s": params.slo.window_s,
                },
                "safeguard": {
                    "abort_after_consecutive_breached_windows": params.abort_after_windows,
                    "window_s": params.slo.window_s,
                },
                "budget": params.budget.model_dump(),
                "load": {
                    "mode": "closed",
                    "concurrency": params.concurrency,
                    "request_timeout_s": params.request_timeout_s,
                },
            },
            "start": _now_iso(),
            "status": "running",
            "deviated": False,
            "steady_states": {"before": None, "during": [], "after": None},
            "run": [],
            "rollbacks": [],
        }

    # -- context manager: setup and the rollback that always runs ------------------------------------

    def __enter__(self) -> Experiment:
        started = time.monotonic()
        try:
            self.dep.start()
        except BaseException:
            self.teardown = self.dep.close()
            raise
        for event in self.dep.events:
            self.activity("action", event.pop("action"), started, event)
        self.journal["experiment"]["deployment"] = {
            "in_process": self.dep.in_process,
            "url": self.dep.url,
            "service": self.dep.root,
            "model": self.dep.model,
            "proxy": self.dep.proxy is not None,
            "server_config": self.params.server.model_dump(mode="json") if self.dep.in_process else None,
        }
        self.journal["experiment"]["traffic"] = traffic(self.ctx, self.dep, self.params.payload)
        self._mix = good_mix(self.ctx, self.dep, self.params.payload)
        if self.params.promql.probes:
            self.promql = PromQLProbes(self.params.promql, self.dep.root, verify=self.tls)
            self.promql.start()
        return self

    def __exit__(self, *exc: object) -> None:
        started = time.monotonic()
        # A shared server the next check must not inherit (it did not hold its SLO, or the
        # experiment broke off) is stopped now; the next check starts a fresh one.
        after = self.journal["steady_states"]["after"]
        healthy = exc[0] is None and not self.stopped and (after is None or after["steady_state_met"])
        if self.promql is not None:
            self.journal["experiment"]["promql"] = self.promql.stop()
        self.teardown = self.dep.close(healthy=healthy)
        self.journal["rollbacks"].append(
            {
                "activity": {"type": "action", "name": "teardown"},
                "status": "succeeded" if self.teardown.get("clean") else "failed",
                "start_s": round(started - self._t0, 3),
                "duration": round(time.monotonic() - started, 3),
                "output": self.teardown,
            }
        )
        if exc[0] is not None and self.journal["status"] == "running":
            self.journal["status"] = "interrupted"
            self.journal["interrupted"] = f"{getattr(exc[0], '__name__', exc[0])}: {exc[1]}"[:500]

    # -- journal ------------------------------------------------------------------------------------

    def activity(
        self, kind: str, name: str, started: float, output: Any, *, status: str = "succeeded", **extra: Any
    ) -> None:
        self.journal["run"].append(
            {
                "activity": {"type": kind, "name": name, **extra},
                "status": status,
                "start_s": round(started - self._t0, 3),
                "duration": round(time.monotonic() - started, 3),
                "output": output,
            }
        )

    def finish(self) -> dict[str, Any]:
        """Close the journal (call after the ``with`` block): status, timings, budget."""
        j = self.journal
        if j["status"] == "running":
            if self.aborted:
                j["status"] = "aborted"
            elif self.interrupted:
                j["status"] = "interrupted"
            else:
                j["status"] = "completed"
        if self.aborted:
            j["aborted"] = self.aborted
        if self.interrupted:
            j["interrupted"] = self.interrupted
        j["end"] = _now_iso()
        j["duration"] = round(time.monotonic() - self._t0, 3)
        j["budget"] = self.ledger.summary()
        j["teardown"] = self.teardown
        return j

    # -- the method ---------------------------------------------------------------------------------

    @property
    def tls(self) -> ssl.SSLContext:
        """One TLS context for every client of the run: httpx builds a new one (the CA bundle parsed
        again, ~45 ms) for each transport made without it, and each load phase makes a transport."""
        if self._tls is None:
            import httpx

            from mmchaos.executors.resources import shared

            resources = getattr(self.ctx, "resources", None)
            with shared(resources, ("tls_context",), httpx.create_ssl_context, lambda _: None) as (tls, _):
                self._tls = tls
        return self._tls

    @property
    def mix(self) -> PayloadMix:
        assert self._mix is not None, "use the experiment as a context manager"
        return self._mix

    def add_toxic(self, toxic: Mapping[str, Any]) -> str:
        started = time.monotonic()
        name = self.dep.add_toxic(toxic)
        self.activity("action", "add_toxic", started, {"toxic": dict(toxic), "name": name}, provider="proxy")
        return name

    def remove_faults(self, why: str = "") -> None:
        started = time.monotonic()
        names = self.dep.clear_toxics()
        self.activity("action", "remove_toxics", started, {"removed": names, "why": why}, provider="proxy")

    def abort(self, reason: str) -> None:
        if self.aborted is None:
            self.aborted = reason
            log.warning("%s: experiment aborted: %s", self.ctx.check_id, reason)
        self.remove_faults(f"abort: {reason}")

    @property
    def stopped(self) -> bool:
        return self.aborted is not None or self.interrupted is not None

    def warmup(self) -> None:
        n = self.params.warmup_requests
        if n and self.dep.warm:
            self.activity("action", "warmup", time.monotonic(), {"skipped": "the run's shared server is warm"})
            return
        if n and not self.stopped:
            self.phase(
                "warmup",
                seconds=max(5.0, self.params.request_timeout_s * 2),
                guarded=False,
                concurrency=1,
                max_requests=n,
            )

    def phase(
        self,
        label: str,
        *,
        seconds: float,
        guarded: bool,
        mix: PayloadMix | None = None,
        concurrency: int | None = None,
        max_requests: int | None = None,
        stop_when: Callable[[WindowTracker], str | None] | None = None,
        track: Callable[[RequestRecord], bool] | None = None,
        activity: str = "probe",
    ) -> Phase:
        """Run closed-loop load for ``seconds`` (within the budget). A guarded phase has the safeguard:
        ``abort_after_windows`` breached windows in a row abort the experiment."""
        started = time.monotonic()
        seconds = min(seconds, self.ledger.remaining_seconds() - 0.1)
        budget_left = self.ledger.remaining_requests()
        if max_requests is not None:
            budget_left = min(budget_left, max_requests)
        if seconds < min(0.2, self.slo.window_s) or budget_left <= 0:
            why = f"budget spent before {label!r} ({self.ledger.sent} requests, {self.ledger.elapsed():.1f} s)"
            self.interrupted = self.interrupted or why
            ph = Phase(label, guarded, None, [], {}, started - self._t0, 0.0, skipped=why)
            self.phases.append(ph)
            return ph
        self._phase_no += 1
        self.inspector.phase = label
        tracker_box: list[WindowTracker] = []
        result, stop_reason = asyncio.run(
            self._run_load(
                label,
                seconds=seconds,
                guarded=guarded,
                mix=mix or self.mix,
                concurrency=concurrency or self.params.concurrency,
                max_requests=budget_left,
                stop_when=stop_when,
                track=track,
                tracker_box=tracker_box,
            )
        )
        tracker = tracker_box[0]
        ph = Phase(
            label,
            guarded,
            result,
            tracker.windows,
            self.inspector.for_phase(label),
            started - self._t0,
            seconds,
            stop_reason=stop_reason,
        )
        self.phases.append(ph)
        summary = ph.summary(self.slo)
        if guarded:
            summary["max_consecutive_breached_windows"] = tracker.max_consecutive_breaches
        self.activity(activity, f"load:{label}", started, summary, provider="load_driver")
        return ph

    async def _run_load(
        self,
        label: str,
        *,
        seconds: float,
        guarded: bool,
        mix: PayloadMix,
        concurrency: int,
        max_requests: int,
        stop_when: Callable[[WindowTracker], str | None] | None,
        track: Callable[[RequestRecord], bool] | None,
        tracker_box: list[WindowTracker],
    ) -> tuple[LoadResult, str | None]:
        import httpx

        from mmchaos.chaos.load import LoadConfig, LoadDriver

        async_cls, _ = budgeted_transports()
        p = self.params
        inner = httpx.AsyncHTTPTransport(
            verify=self.tls,  # fresh connections each phase (its own event loop), one TLS context
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency,
                                keepalive_expiry=CLIENT_KEEPALIVE_EXPIRY),
        )
        transport = async_cls(inner, self.ledger, self.inspector)
        cfg = LoadConfig(
            base_url=self.dep.url,
            mode="closed",
            concurrency=concurrency,
            max_requests=max_requests,
            max_duration=seconds,
            request_timeout=p.request_timeout_s,
            slo_latency_ms=self.slo.p99_ms,
            # A request still unanswered this long after the phase has missed the SLO whatever comes
            # (and past its own timeout, it has failed).
            drain_s=min(self.slo.p99_ms / 1000.0, p.request_timeout_s),
            allow_remote=not p.budget.loopback_only,
            seed=self.seed + self._phase_no,
            resend_stale=self.resend_stale,
        )
        loop = asyncio.get_running_loop()
        tracker = WindowTracker(self.slo, loop.time())
        tracker_box.append(tracker)
        stop: list[str] = []
        removed: list[str] = []
        aborted_at: list[float] = []

        def on_record(record: RequestRecord) -> None:
            if track is None or track(record):
                tracker.add(record, loop.time())

        async with httpx.AsyncClient(
            base_url=self.dep.url,
            transport=transport,
            timeout=p.request_timeout_s,
            headers=self.dep.auth,
            trust_env=False,
        ) as client:
            driver = LoadDriver(cfg, mix, client=client, on_record=on_record)
            done = asyncio.Event()

            async def watch() -> None:
                tick = min(0.05, self.slo.window_s / 4)
                while not done.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(done.wait(), tick)
                    tracker.close_until(loop.time(), self.ledger.inflight)
                    if stop:
                        continue
                    if guarded and tracker.consecutive_breaches >= p.abort_after_windows:
                        last = tracker.windows[-1]
                        reason = (
                            f"safeguard: the SLO ({self.slo.describe()}) was breached for "
                            f"{tracker.consecutive_breaches} consecutive {self.slo.window_s:g} s windows during "
                            f"{label!r} (last window: success {last.ok}/{last.events}, p99 {last.p99_ms} ms)"
                        )
                        stop.append(reason)
                        driver.abort(reason)
                        self.aborted = self.aborted or reason
                        aborted_at.append(loop.time())
                        removed.extend(await loop.run_in_executor(None, self.dep.clear_toxics))
                    elif stop_when is not None and (why := stop_when(tracker)) is not None:
                        stop.append(why)
                        driver.abort(why)

            watcher = loop.create_task(watch())
            try:
                result = await driver.run()
            finally:
                done.set()
                await watcher
            tracker.close_final(loop.time())
        if self.aborted and stop and stop[0] == self.aborted:
            self.activity(
                "action",
                "safeguard_abort",
                time.monotonic(),
                {
                    "reason": self.aborted,
                    "phase": label,
                    "at_s": round(aborted_at[0] - tracker.t0, 3) if aborted_at else None,
                    "faults_removed": removed,
                },
            )
        return result, stop[0] if stop else None

    def decided(self, only: str | None = None) -> Callable[[WindowTracker], str | None] | None:
        """The sequential stop rule of this experiment's probes (None: fixed-length phases);
        ``only="met"`` stops early on a met SLO only."""
        rule = self.params.sequential
        return stop_when_decided(self.slo, rule, only=only) if rule.enabled else None

    def steady_state(self, which: Literal["before", "after"]) -> Phase:
        reused = self.dep.recent_steady_state(self.slo) if which == "before" else None
        if reused is not None:
            ph, info = reused[0], reused[1]
            assert isinstance(ph, Phase)
            self.activity("probe", f"load:steady_state_{which}", time.monotonic(), {**info, "phase": ph.label})
        else:
            info = None
            ph = self.phase(f"steady_state_{which}", seconds=self.params.baseline_s, guarded=True,
                            stop_when=self.decided())  # fmt: skip
        met = ph.met(self.slo)
        promql: dict[str, Any] = {}
        probes_held = self._promql_probes(which, ph.label, promql)
        if which == "after" and met and probes_held and not self.stopped:
            self.dep.remember_steady_state(ph, self.slo, self.ctx.check_id)
        self.journal["steady_states"][which] = {
            "steady_state_met": met,
            **({"reused": info} if info is not None else {}),
            "probes": [
                {
                    "name": "success-rate",
                    "tolerance": {"min": self.slo.min_success_rate},
                    "output": round(ph.success_rate, 4),
                    "tolerance_met": ph.success_rate >= self.slo.min_success_rate,
                },
                {
                    "name": "p99-latency-ms",
                    "tolerance": {"max": self.slo.p99_ms},
                    "output": ph.p99_ms,
                    "tolerance_met": ph.p99_ms is not None and ph.p99_ms <= self.slo.p99_ms,
                },
            ],
        }
        entry = self.journal["steady_states"][which]
        if not met:
            entry.update(explain_unmet(ph, self.slo, before=which == "before"))
        if promql:
            entry["promql"] = promql["promql"]
        if not probes_held:
            met = entry["steady_state_met"] = False
            entry["why"] = f"{entry['why']}; {promql['why']}" if entry.get("why") else promql["why"]
            entry.setdefault("harness_problem", False)
        if which == "after" and not met:
            self.journal["deviated"] = True
        return ph

    def during(self, label: str, ph: Phase) -> None:
        entry = {
            "phase": label,
            "steady_state_met": ph.met(self.slo),
            "success_rate": round(ph.success_rate, 4),
            "p99_ms": ph.p99_ms,
        }
        self._promql_probes("during", label, entry)
        self.journal["steady_states"]["during"].append(entry)

    def _promql_probes(self, which: str, label: str, entry: dict[str, Any]) -> bool:
        """The PromQL probes for ``which`` into ``entry`` (``promql``, and ``why`` or ``promql_failed``); False
        when one failed (after: during any fault too, so a probe that failed during one deviates after)."""
        if self.promql is None:
            return True
        results = self.promql.check(which, label)
        if results:
            entry["promql"] = results
        if which == "after":
            failed = [r for r in self.promql.failed if r["phase"] in ("during", "after")]
        else:
            failed = [r for r in results if not r["holds"]]
        if not failed:
            return True
        entry["promql_failed" if which == "during" else "why"] = describe_failures(failed)
        return False

    def recover(self, label: str, *, allowance_s: float = 0.0) -> tuple[Phase, float | None]:
        """Load from fresh connections until a window meets the SLO; the seconds from the fault's removal
        to the first good answer of that window (None: not within ``max_recovery_s`` plus
        ``allowance_s``, and the experiment is aborted).

        ``allowance_s``: time the service is granted on top of ``max_recovery_s`` to finish work it
        had already accepted (an overload ramp's backlog), measured by the caller in this run."""
        limit = self.params.max_recovery_s + max(0.0, allowance_s)
        good: list[float] = []

        def recovered(tracker: WindowTracker) -> str | None:
            for w in tracker.windows:
                if w.met:
                    good.append(w.first_ok if w.first_ok is not None else w.start + self.slo.window_s)
                    return "recovered"
            return None

        ph = self.phase(label, seconds=limit + self.slo.window_s, guarded=False, stop_when=recovered)
        if ph.result is None:
            return ph, None
        if not good:
            for w in ph.windows:  # the final, partial window may still show it
                if w.met:
                    good.append(w.first_ok if w.first_ok is not None else w.start + self.slo.window_s)
                    break
        seconds = good[0] if good else None
        if seconds is not None and seconds > limit + 1e-9:
            seconds = None
        if seconds is None and not self.stopped:
            # What the service was doing when it did not come back: enough to tell a wedged server
            # from a slow one, or the harness's proxy, without rerunning.
            started = time.monotonic()
            self.activity("probe", "diagnose", started, {"after": label, **self.dep.diagnose()})
            self.abort(f"the service did not meet its SLO again within {limit:.3g} s ({label})")
        return ph, seconds

    def seconds(self) -> float:
        return time.monotonic() - self._t0


def jsonable(value: Any) -> Any:
    """A value made safe for results.json (no NaN, no numpy scalars)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
