"""Leader election over a coordination.k8s.io/v1 Lease, as client-go's `tools/leaderelection` does it.

The holder renews `spec.renewTime` every retry period with a compare-and-swap (PUT with the resourceVersion of
the Lease it wrote last, with no read first: one request per renewal; a lost swap falls back to a read), and
stops acting once it could not renew for the renew deadline. A standby reads the Lease every retry period and
takes it only when the record (holder, renewTime, ...) has not changed for `leaseDurationSeconds` measured on its
own monotonic clock, so clock skew between machines does not matter. A holder that stops cleanly empties
`holderIdentity`, and a standby takes over at its next attempt.

Source of the algorithm and of the default timings (15 s, 10 s, 2 s): k8s.io/client-go/tools/leaderelection
(`tryAcquireOrRenew`, `renew`, `release`) and controller-runtime's manager defaults.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
import time
from typing import Any

from rlightning_operator import _kube as kube

logger = logging.getLogger(__name__)


def micro_time(moment: datetime.datetime | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC), as Lease times are written.

    Args:
        moment (datetime.datetime | None, optional): The time; None for now. Defaults to None.

    Returns:
        str: For example "2026-12-01T07:30:00.123456Z".
    """
    moment = moment or datetime.datetime.now(datetime.UTC)
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Campaigns for one Lease and keeps it.

    Args:
        client (kube.KubeClient): The API.
        namespace (str): Namespace of the Lease.
        name (str): Name of the Lease (made when missing).
        identity (str): This candidate's `holderIdentity`, unique per process.
        lease_duration (float): Seconds a standby waits after the last change it saw of the record.
        renew_deadline (float): Seconds without a successful renewal after which the holder gives up.
        retry_period (float): Seconds between attempts; also the bound on each request.
    """

    def __init__(
        self,
        client: kube.KubeClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float,
        renew_deadline: float,
        retry_period: float,
    ) -> None:
        self._client = client
        self.namespace, self.name, self.identity = namespace, name, identity
        self._lease_duration, self._renew_deadline, self._retry_period = lease_duration, renew_deadline, retry_period
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._held: dict[str, Any] | None = None  # the Lease as this candidate last wrote it, while it holds it
        self.leading = False
        self.renewed_at = 0.0
        # One attempt or the release at a time; once released, no attempt may take the Lease back (a renewal
        # still in flight when kopf stopped would otherwise find it free and take it from "nobody").
        self._lock = threading.Lock()
        self._released = False

    def try_acquire_or_renew(self) -> bool:
        """One attempt: create the Lease, renew it, or take it over when its holder has gone quiet.

        Returns:
            bool: Whether this candidate holds the Lease now. API errors, including a lost compare-and-swap
                (409), count as "no", and so does every attempt after `release()`.
        """
        with self._lock:
            if self._released:
                return False
            return self._attempt()

    def _attempt(self) -> bool:
        held, self._held = self._held, None
        try:
            if held is not None:  # client-go's fast path: renew what it wrote last; a lost swap reads below
                try:
                    self._held = self._client.replace(self._lease(held["metadata"], held["spec"], micro_time()),
                                                      timeout=self._retry_period)
                    self._observe(self._held)
                    return True
                except kube.ApiError as error:
                    logger.debug("Lease %s/%s: renewal without a read: %s", self.namespace, self.name, error)
            lease = self._client.read("Lease", self.namespace, self.name, timeout=self._retry_period)
            now = micro_time()
            if lease is None:
                self._held = self._client.create(self._lease({}, {}, now), timeout=self._retry_period)
                self._observe(self._held)
                return True
            spec = lease.get("spec") or {}
            self._observe(lease)
            holder = spec.get("holderIdentity") or ""
            duration = float(spec.get("leaseDurationSeconds") or self._lease_duration)
            if holder and holder != self.identity and time.monotonic() < self._observed_at + duration:
                return False
            self._held = self._client.replace(self._lease(lease["metadata"], spec, now), timeout=self._retry_period)
            self._observe(self._held)
            if holder != self.identity:
                logger.info("took Lease %s/%s from %r", self.namespace, self.name, holder or "nobody")
            return True
        except kube.ApiError as error:
            logger.debug("Lease %s/%s: %s", self.namespace, self.name, error)
            return False

    def _lease(self, metadata: dict[str, Any], spec: dict[str, Any], now: str) -> dict[str, Any]:
        """The Lease held by this candidate, renewed at `now` (keeps resourceVersion for the compare-and-swap)."""
        mine = spec.get("holderIdentity") == self.identity
        transitions = int(spec.get("leaseTransitions") or 0)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {**metadata, "name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self._lease_duration)),
                "acquireTime": spec.get("acquireTime") if mine else now,
                "renewTime": now,
                "leaseTransitions": transitions if mine or not spec else transitions + 1,
            },
        }

    def _observe(self, lease: dict[str, Any]) -> None:
        spec = lease.get("spec") or {}
        record = tuple(spec.get(key) for key in ("holderIdentity", "renewTime", "acquireTime",
                                                  "leaseDurationSeconds", "leaseTransitions"))
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()

    async def acquire(self) -> None:
        """Wait, as a standby, until this candidate holds the Lease (no bound: a standby may wait forever)."""
        logger.info("standby: waiting for Lease %s/%s as %s", self.namespace, self.name, self.identity)
        while not await asyncio.to_thread(self.try_acquire_or_renew):
            await asyncio.sleep(self._retry_period)
        self.leading, self.renewed_at = True, time.monotonic()
        logger.info("leading: holding Lease %s/%s as %s", self.namespace, self.name, self.identity)

    async def hold(self) -> None:
        """Renew every retry period; return once no renewal succeeded for the renew deadline (leadership lost).

        Each attempt is awaited only until the deadline, so a request hanging on a dead connection cannot keep
        the holder acting after a standby may have taken over.
        """
        while True:
            remaining = self.renewed_at + self._renew_deadline - time.monotonic()
            if remaining <= 0:
                self.leading = False
                return
            await asyncio.sleep(min(self._retry_period, remaining))
            remaining = self.renewed_at + self._renew_deadline - time.monotonic()
            try:
                renewed = await asyncio.wait_for(asyncio.to_thread(self.try_acquire_or_renew), max(remaining, 0.01))
            except TimeoutError:
                renewed = False
            if renewed:
                self.renewed_at = time.monotonic()

    def release(self) -> None:
        """Give the Lease up for good (holderIdentity emptied) so that a standby takes over at once; best effort.

        Waits for an attempt in flight (each of its requests is bounded by the retry period); no later attempt
        of this candidate succeeds.
        """
        with self._lock:
            self._released = True
            if self.leading:
                self.leading, self._held = False, None
                self._empty_holder()

    def _empty_holder(self) -> None:
        try:
            lease = self._client.read("Lease", self.namespace, self.name, timeout=self._retry_period)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": micro_time()}
            self._client.replace({**lease, "spec": spec}, timeout=self._retry_period)
            logger.info("released Lease %s/%s", self.namespace, self.name)
        except kube.ApiError as error:
            logger.warning("could not release Lease %s/%s: %s", self.namespace, self.name, error)
