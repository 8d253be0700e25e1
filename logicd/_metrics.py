"""The logic server's own Prometheus metrics: requests, latency, stages, model-call errors and admission."""

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ._admission import RouteGate


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "logicd_requests", "Requests answered, by route and status", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "logicd_request_duration_seconds", "Request latency by route", ["route"], registry=self.registry
        )
        self.stages = Histogram(
            "logicd_stage_duration_seconds", "Time per stage of a route", ["route", "stage"], registry=self.registry
        )
        self.model_errors = Counter(
            "logicd_model_errors", "Model-call errors by kind", ["route", "kind"], registry=self.registry
        )
        self.refused = Counter(
            "logicd_admission_refused",
            "Requests refused at the door, by route and reason",
            ["route", "reason"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "logicd_admission_in_flight", "Requests admitted, in their handler", ["route"], registry=self.registry
        )
        self.waiting = Gauge(
            "logicd_admission_waiting", "Requests waiting for a slot", ["route"], registry=self.registry
        )
        self.limit = Gauge(
            "logicd_admission_limit",
            "Requests a route takes at once (max_in_flight)",
            ["route"],
            registry=self.registry,
        )
        self.overloaded = Gauge(
            "logicd_admission_overloaded",
            "1 while the route refuses a storm down to its target wait, else 0",
            ["route"],
            registry=self.registry,
        )
        self.expected_wait = Gauge(
            "logicd_admission_expected_wait_seconds",
            "How long a request arriving now would wait for what is ahead of it (the learnt pace)",
            ["route"],
            registry=self.registry,
        )

    def refusal(self, route: str, status: int, reason: str) -> None:
        self.requests.labels(route, str(status)).inc()
        self.refused.labels(route, reason).inc()

    def gates(self, gates: Sequence[RouteGate]) -> None:
        """The admission gauges as they stand now (set at each scrape)."""
        for gate in gates:
            self.in_flight.labels(gate.route).set(gate.in_flight)
            self.waiting.labels(gate.route).set(gate.waiting)
            self.limit.labels(gate.route).set(gate.limit)
            self.overloaded.labels(gate.route).set(1 if gate.overloaded else 0)
            expected = gate.expected_wait_s()
            if expected is not None:
                self.expected_wait.labels(gate.route).set(expected)
